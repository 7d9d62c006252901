"""Secret scrubbing: replaces credentials in text with ``[REDACTED:<rule>]`` before it is kept.

Used on every branch return message (and by anything else that stores text written by an
agent). It fails closed: if scrubbing fails, `scrub` raises `ScrubError` and the caller
must refuse the operation rather than store the text unscrubbed.

Each rule has keywords: a rule's regular expression runs only when one of its keywords
appears in the lower-cased text, so clean text costs one ``lower()`` and a few substring
searches. Rules run in order, and a redaction marker never matches a later rule, so the
most specific rule names a secret (an Anthropic key is not reported as an OpenAI one),
and a later rule never redacts or counts a marker again.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field


class ScrubError(Exception):
    """Scrubbing failed; the text must not be stored or returned as is."""


@dataclass(frozen=True)
class Rule:
    """One credential format.

    Args:
        name: the label in ``[REDACTED:<name>]`` and in the counts.
        pattern: what to find; ``secret`` (a named group) is what is redacted when the
            pattern has it (``password=`` stays, the value goes), else the whole match.
        keywords: lower-case substrings; the pattern runs only when one is present.
    """

    name: str
    pattern: re.Pattern[str]
    keywords: tuple[str, ...]


def _rule(name: str, pattern: str, *keywords: str, flags: int = 0) -> Rule:
    return Rule(name, re.compile(pattern, flags), keywords)


# The name is matched from its secret-looking word on (the "DB_" of DB_PASSWORD is never
# redacted, so it need not be matched): a pattern that began with the name's free-form
# prefix would be retried from every word boundary of a long token.
_SECRET_NAME = (r"(?:secret|passw(?:or)?d|passwd|pwd|token|api[_-]?key|access[_-]?key|"
                r"private[_-]?key|credentials?|auth[_-]?key)[A-Za-z0-9_.-]{0,40}")

RULES: tuple[Rule, ...] = (
    _rule("private_key",
          r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----[\s\S]*?"
          r"(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|\Z)",
          "private key"),
    _rule("aws_access_key_id", r"\b(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}\b",
          "akia", "asia", "abia", "acca"),
    _rule("aws_secret_access_key",
          r"(?i)aws_?secret_?access_?key\W{0,5}(?P<secret>[A-Za-z0-9/+=]{40})(?![A-Za-z0-9/+=])",
          "secret_access", "secretaccess"),
    _rule("google_api_key", r"\bAIza[0-9A-Za-z_-]{35}(?![0-9A-Za-z_-])", "aiza"),
    _rule("google_oauth_secret", r"\bGOCSPX-[A-Za-z0-9_-]{28}(?![A-Za-z0-9_-])", "gocspx-"),
    _rule("azure_storage_key", r"(?i)AccountKey=(?P<secret>[A-Za-z0-9+/]{60,}={0,2})",
          "accountkey="),
    _rule("github_token", r"\bgh[pousr]_[A-Za-z0-9]{36,255}\b",
          "ghp_", "gho_", "ghu_", "ghs_", "ghr_"),
    _rule("github_fine_grained_token", r"\bgithub_pat_[A-Za-z0-9_]{82}\b", "github_pat_"),
    _rule("gitlab_token", r"\bglpat-[A-Za-z0-9_-]{20,}(?![A-Za-z0-9_-])", "glpat-"),
    _rule("slack_token", r"\bxox[abposr]-[A-Za-z0-9-]{10,}", "xox"),
    _rule("slack_webhook", r"https://hooks\.slack\.com/services/[A-Za-z0-9/_-]+",
          "hooks.slack.com"),
    _rule("discord_webhook",
          r"https://(?:ptb\.|canary\.)?discord(?:app)?\.com/api/webhooks/\d+/[A-Za-z0-9_-]+",
          "discord"),
    _rule("telegram_bot_token", r"\b\d{8,10}:AA[A-Za-z0-9_-]{33}(?![A-Za-z0-9_-])", ":aa"),
    _rule("stripe_key", r"\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{24,99}\b",
          "sk_live_", "sk_test_", "rk_live_", "rk_test_"),
    _rule("anthropic_api_key", r"\bsk-ant-(?:api|admin)\d{2}-[A-Za-z0-9_-]{80,}", "sk-ant-"),
    _rule("openai_api_key",
          r"\bsk-(?:(?:proj|svcacct|admin)-[A-Za-z0-9_-]{40,}|[A-Za-z0-9]{48})(?![A-Za-z0-9_-])",
          "sk-"),
    _rule("huggingface_token", r"\bhf_[A-Za-z0-9]{34,}\b", "hf_"),
    _rule("npm_token", r"\bnpm_[A-Za-z0-9]{36}\b", "npm_"),
    _rule("pypi_token", r"\bpypi-AgEIcHlwaS5vcmc[A-Za-z0-9_-]{50,}", "pypi-ageichlwas5vcmc"),
    _rule("sendgrid_key", r"\bSG\.[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}(?![A-Za-z0-9_-])", "sg."),
    _rule("digitalocean_token", r"\bdo[por]_v1_[a-f0-9]{64}\b", "_v1_"),
    _rule("shopify_token", r"\bshp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}\b",
          "shpat_", "shpca_", "shppa_", "shpss_"),
    _rule("jwt", r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}", "eyj"),
    _rule("bearer_token", r"(?i)\bbearer\s+(?P<secret>[A-Za-z0-9._~+/-]{16,}=*)", "bearer"),
    _rule("basic_auth", r"(?i)\bauthorization:\s*basic\s+(?P<secret>[A-Za-z0-9+/]{8,}=*)",
          "basic"),
    _rule("url_password",
          r"\b[A-Za-z][A-Za-z0-9+.-]{0,30}://[^\s:/@]{1,256}:(?P<secret>[^\s/@]{1,256})@",
          "://"),
    _rule("secret_assignment",
          rf"(?i){_SECRET_NAME}[\"']?\s*[:=]\s*[\"']?"
          r"(?P<secret>(?![$<{%])[^\s\"'`,;()]{6,})",
          "secret", "passw", "pwd", "token", "api_key", "apikey", "api-key", "access_key",
          "accesskey", "private_key", "credential", "auth_key"),
)


@dataclass(frozen=True)
class Scrubbed:
    """The scrubbed text and how many secrets each rule removed."""

    text: str
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def scrub(text: str, rules: tuple[Rule, ...] = RULES) -> Scrubbed:
    """Redact every credential the rules recognise.

    Raises:
        ScrubError: anything went wrong; the caller must not keep ``text``.
    """
    try:
        if not isinstance(text, str):
            raise TypeError(f"expected str, got {type(text).__name__}")
        counts: Counter[str] = Counter()
        lowered = text.lower()
        for rule in rules:
            if not any(keyword in lowered for keyword in rule.keywords):
                continue
            text, found = _apply(rule, text)
            if found:
                counts[rule.name] += found
                lowered = text.lower()
        return Scrubbed(text, dict(counts))
    except Exception as exc:
        raise ScrubError(f"could not scrub secrets: {type(exc).__name__}: {exc}") from exc


_MARKER = "[REDACTED:"


def _apply(rule: Rule, text: str) -> tuple[str, int]:
    """Redact the rule's matches; a match that is already a marker is left alone."""
    marker = f"{_MARKER}{rule.name}]"
    group = "secret" if "secret" in rule.pattern.groupindex else 0
    found = 0

    def redact(match: re.Match[str]) -> str:
        nonlocal found
        start, end = match.span(group)
        if match.string.startswith(_MARKER, start):
            return match.group()
        found += 1
        offset = match.start()
        return match.group()[:start - offset] + marker + match.group()[end - offset:]

    return rule.pattern.sub(redact, text), found


__all__ = ["RULES", "Rule", "ScrubError", "Scrubbed", "scrub"]
