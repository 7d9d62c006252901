"""ctxclient: the Python client of ctxd (blocking `Client`, trio `connect`) and `ctxctl`."""

from ctxclient._async import AsyncClient, connect
from ctxclient._errors import DaemonUnavailable, RpcError
from ctxclient._sync import Client

__all__ = ["AsyncClient", "Client", "DaemonUnavailable", "RpcError", "connect"]
