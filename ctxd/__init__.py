"""ctxd: a local daemon that manages the context of LLM agents."""

__version__ = "0.1.0"

__all__ = ["__version__"]
