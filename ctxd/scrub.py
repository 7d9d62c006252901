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

import itertools
import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple


class ScrubError(Exception):
    """Scrubbing failed; the text must not be stored or returned as is."""


class Found(NamedTuple):
    """A match of a rule's pattern: on ``text`` or on its lower-case twin (same length)."""

    text: str
    match: re.Match[str]

    def group(self, name: str) -> str | None:
        """The part of ``text`` that group ``name`` matched (None: it took no part)."""
        start, end = self.match.span(name)
        return None if start < 0 else self.text[start:end]


@dataclass(frozen=True)
class Rule:
    """One credential format.

    Args:
        name: the label in ``[REDACTED:<name>]`` and in the counts.
        pattern: what to find; the first named group whose name starts with ``secret``
            and that took part in the match is what is redacted (``password=`` stays, the
            value goes), else the whole match.
        keywords: lower-case substrings; the pattern runs only when one is present.
        check: given the match, whether it is a secret (a value that looks like code or
            a placeholder is not); None: every match is.
        lower_pattern: for a rule whose case does not matter, ``pattern`` without
            IGNORECASE, run on the lower-cased text (several times faster than
            IGNORECASE); ``pattern`` runs on the text itself when lower-casing changed its
            length (a few Unicode letters).
    """

    name: str
    pattern: re.Pattern[str]
    keywords: tuple[str, ...]
    check: Callable[[Found], bool] | None = None
    lower_pattern: re.Pattern[str] | None = None

    @property
    def secret_groups(self) -> tuple[str, ...]:
        return tuple(name for name in self.pattern.groupindex if name.startswith("secret"))


def _rule(name: str, pattern: str, *keywords: str, caseless: bool = False,
          check: Callable[[Found], bool] | None = None) -> Rule:
    """A rule; ``caseless``: ``pattern`` is written in lower case and matches any case."""
    if caseless:
        return Rule(name, re.compile(pattern, re.IGNORECASE), keywords, check,
                    re.compile(pattern))
    return Rule(name, re.compile(pattern), keywords, check)


def _secret(found: Found) -> str:
    """The value a match found (its first ``secret*`` group that took part)."""
    for name in found.match.re.groupindex:
        if name.startswith("secret") and (value := found.group(name)) is not None:
            return value
    start, end = found.match.span()
    return found.text[start:end]


_PLACEHOLDER_START = ("$", "<", "{", "%", "[", "#")


def _placeholder(value: str) -> bool:
    """``${DB_PASSWORD}``, ``<your token>``, ``{token}``, ``%(pw)s``, ``****``, ``xxxxxx``."""
    return value.startswith(_PLACEHOLDER_START) or (len(value) >= 3 and len(set(value)) == 1) \
        or value.lower() in ("none", "null", "true", "false", "changeme", "redacted")


def _not_placeholder(match: Found) -> bool:
    return not _placeholder(_secret(match))


def _shannon_bits(value: str) -> float:
    """Bits of entropy per character of ``value`` (its own character frequencies)."""
    return -sum(n / len(value) * math.log2(n / len(value)) for n in Counter(value).values())


def _looks_random(value: str) -> bool:
    """Whether an unquoted word is a secret rather than a word of code or prose.

    Code assigns names (``token = budget.tokens``, ``password=password_hash``): letters,
    ``_`` and ``.``, in one case or camelCase. A secret has a digit or another symbol (a
    ``-`` too: ``correct-horse-battery``), or mixes
    cases at random (``PrTOzSJgJMHxPIVh``: at least three lower-to-upper changes), or is
    a long run of letters in one case with no ``_`` or ``.`` (``correcthorsebattery``).
    """
    if any(not (c.isalpha() or c in "_.") for c in value):
        return True
    humps = sum(a.islower() and b.isupper() for a, b in itertools.pairwise(value))
    if humps >= 3:
        return True
    return len(value) >= 12 and value.isalpha() and (value.islower() or value.isupper())


_CODE_NAME = re.compile(r"[A-Za-z_][A-Za-z_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
"""A name in code (``HEALTH_ORDER.index``, ``session_id``): not a secret, however mixed."""

_CODE_CALL = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*\(")
"""A call in code (``get_password(user``), which an unquoted value's parentheses may be."""
_CODE_WORDS = re.compile(r"[A-Za-z0-9_.()]+")
"""What such a call holds: names, numbers and parentheses (a secret has other symbols)."""


def _assigned_secret(match: Found) -> bool:
    """A value given to a secret-named key: any quoted value, or an unquoted one that looks
    random (:func:`_looks_random`), unless it is a placeholder. An upper-case key
    (``DB_PASSWORD=``, an environment variable) takes any unquoted value but a dotted name
    of code (``PASSWD = getpass.getpass``)."""
    value = _secret(match)
    if _placeholder(value):
        return False
    if match.group("secret_bare") is None:
        return True
    if _CODE_CALL.match(value) and _CODE_WORDS.fullmatch(value):
        return False
    if (match.group("key") or "").isupper():
        return "." not in value or not _CODE_NAME.fullmatch(value)
    return _looks_random(value)


_HIGH_ENTROPY_BITS = 3.5
"""Entropy per character above which a value of 16 or more characters is random: base64
and hex secrets of that length score 3.6 to 5 bits, English words and identifiers 2.5 to 3.3."""


def _high_entropy(match: Found) -> bool:
    """A long value, with at least two of lower case, upper case and digits, whose
    characters are spread out like a random string's."""
    value = _secret(match)
    if _placeholder(value) or _CODE_NAME.fullmatch(value):
        return False
    classes = sum((any(c.islower() for c in value), any(c.isupper() for c in value),
                   any(c.isdigit() for c in value)))
    return classes >= 2 and _shannon_bits(value) >= _HIGH_ENTROPY_BITS


def _flag_secret(match: Found) -> bool:
    """A CLI flag's value: given with ``=`` or quoted, anything but a placeholder; after a
    space, only one that looks random (a flag named in prose, followed by a word, is not)."""
    value = _secret(match)
    if _placeholder(value) or value.startswith("-"):
        return False
    return match.group("secret_bare_spaced") is None or _looks_random(value.rstrip(".,;:!?)"))


# A key is secret-named when its name ENDS with a secret word (DB_PASSWORD, apiKey,
# "signing_key", client_secret): the match starts at that word, so a long identifier is not
# rescanned from each of its word boundaries, and ends at a non-name character, so
# TOKEN_FILE, password_hash and tokens (a count) are not keys of secrets.
_SECRET_WORD = (r"(?:passw(?:or)?d|passphrase|[_-]pwd|secrets?|token|credentials?|"
                r"(?:api|access|private|secret|auth|app|application|encryption|signing|"
                r"master|client)[_-]?key)(?![A-Za-z0-9_-])")
def _value(bare: str, suffix: str = "") -> str:
    """A value: a JSON/TOML string (with its escapes), a single-quoted one, an escaped JSON
    string inside a JSON string, or a bare word of ``bare`` characters (to the next space or
    delimiter). Each alternative matches one way only, a quoted one within 4 KiB, so
    scrubbing stays linear. The groups are ``secret``, ``secret_single``, ``secret_escaped`` and
    ``secret_bare``, each followed by ``suffix``."""
    return (rf"(?:\"(?P<secret{suffix}>(?:[^\"\\\n]|\\.){{1,4096}})\""
            rf"|'(?P<secret_single{suffix}>[^'\n]{{1,4096}})'"
            rf"|\\\"(?P<secret_escaped{suffix}>[^\"\\\n]{{1,4096}})\\\""
            rf"|(?P<secret_bare{suffix}>{bare}))")


_BARE_WORD = r"[^\s\"'`,;()\[\]{}<>\\]"
_BARE_VALUE = rf"(?=[^\s\"'`,;\[\]{{}}<>\\]{{6}}){_BARE_WORD}+(?:[()]+{_BARE_WORD}+)*"
"""An unquoted value of 6 characters or more: bare words, and the parentheses between them
(a Django ``SECRET_KEY`` has some); a closing one at its end is code's, not the value's."""
_ASSIGN = r"\\?[\"']?[ \t]*(?::=|=>|[:=])[ \t]*"
"""Between a key and its value: a closing quote (an escaped one in JSON inside JSON), then
``:``, ``=``, ``:=`` or ``=>``, and spaces or tabs on the same line (a YAML key alone on its
line, ``credentials:``, has its value on the next lines, each with its own key)."""

_CSV_FIELD = r"(?:\"(?:[^\"\n]|\"\"){1,512}\"|[^,\"\r\n]{1,512})"
"""A field of a CSV row: quoted (``""`` inside), or bare to the next comma or line end."""
_CSV_MORE = r"(?:,[a-z ]{1,64}){0,8}\r?\n"
"""The rest of a header line of AWS's CSV (more columns), lower-cased, and its end."""

RULES: tuple[Rule, ...] = (
    # PEM, and PuTTY's .ppk (its header to its Private-MAC line), to their end or the text's.
    _rule("private_key",
          r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----[\s\S]*?"
          r"(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|\Z)"
          r"|PuTTY-User-Key-File-\d+:[\s\S]*?(?:Private-(?:MAC|Hash):[ \t]*[0-9a-fA-F]*|\Z)",
          "private key", "putty-user-key-file-"),
    # The CSV the AWS console hands out (credentials.csv, <user>_accessKeys.csv): the row
    # after its header, from the password (or the secret key) to the secret key.
    _rule("aws_credentials_csv",
          r"(?m)^\ufeff?(?:user name,password,access key id,secret access key" + _CSV_MORE
          + rf"{_CSV_FIELD},(?P<secret>{_CSV_FIELD},{_CSV_FIELD},{_CSV_FIELD})"
          r"|user name,password" + _CSV_MORE + rf"{_CSV_FIELD},(?P<secret_password>{_CSV_FIELD})"
          r"|user name,access key id,secret access key" + _CSV_MORE
          + rf"{_CSV_FIELD},{_CSV_FIELD},(?P<secret_user_key>{_CSV_FIELD})"
          r"|access key id,secret access key" + _CSV_MORE
          + rf"{_CSV_FIELD},(?P<secret_key>{_CSV_FIELD}))",
          "user name,password", "secret access key", caseless=True),
    _rule("aws_access_key_id", r"\b(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}\b",
          "akia", "asia", "abia", "acca"),
    # After its usual names, also bare (a space or a newline between): aws_secret_access_key,
    # SecretAccessKey (the JSON of `aws sts`), aws_secret_key.
    _rule("aws_secret_access_key",
          r"(?:(?:aws_?)?secret_?access_?key|aws_?secret_?key)\W{0,5}"
          r"(?P<secret>[A-Za-z0-9/+=]{40})(?![A-Za-z0-9/+=])",
          "secret_access", "secretaccess", "aws_secret", "awssecret", caseless=True),
    _rule("google_api_key", r"\bAIza[0-9A-Za-z_-]{35}(?![0-9A-Za-z_-])", "aiza"),
    _rule("google_oauth_secret", r"\bGOCSPX-[A-Za-z0-9_-]{28}(?![A-Za-z0-9_-])", "gocspx-"),
    _rule("azure_storage_key", r"accountkey=(?P<secret>[A-Za-z0-9+/]{60,}={0,2})",
          "accountkey=", caseless=True),
    _rule("azure_sas_signature", r"[?&;]sig=(?P<secret>[A-Za-z0-9%+/=_-]{16,})",
          "sig=", caseless=True),
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
    # A bot token: the bot's id in base64 (it starts M, N or O), a timestamp, an HMAC.
    _rule("discord_bot_token",
          r"\b[MNO][A-Za-z0-9_-]{23,27}\.[A-Za-z0-9_-]{6}\.[A-Za-z0-9_-]{27,38}"
          r"(?![A-Za-z0-9_-])", "."),
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
    _rule("vault_token", r"\bhv[sbr]\.[A-Za-z0-9_-]{24,}", "hvs.", "hvb.", "hvr."),
    _rule("heroku_api_key", r"\bHRKU-[A-Za-z0-9_-]{20,}", "hrku-"),
    _rule("mailgun_key", r"\bkey-[0-9a-zA-Z]{32}(?![0-9a-zA-Z])", "key-"),
    # Twilio's auth token is 32 hex digits after its name, its API key secret SK + 32 hex.
    _rule("twilio_secret",
          r"(?:twilio\W{0,3}(?:auth\W?token|secret)|auth_?token)"
          r"\W{0,5}(?P<secret>[0-9a-f]{32})(?![0-9a-z])|\bsk[0-9a-f]{32}\b",
          "twilio", "auth_token", "authtoken", "sk", caseless=True),
    _rule("jwt", r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}", "eyj"),
    _rule("bearer_token", r"\bbearer\s+(?P<secret>[A-Za-z0-9._~+/-]{16,}=*)", "bearer",
          caseless=True),
    _rule("basic_auth", r"\bauthorization:\s*basic\s+(?P<secret>[A-Za-z0-9+/]{8,}=*)",
          "basic", caseless=True),
    _rule("okta_token", r"\bssws[ \t]+(?P<secret>[a-z0-9_-]{20,})(?![a-z0-9_-])", "ssws",
          caseless=True),
    # kubeconfig's user key, inline (base64 of a PEM key): YAML or JSON.
    _rule("kubeconfig_client_key",
          r"client-key-data[\"']?[ \t]*:[ \t]*[\"']?(?P<secret>[A-Za-z0-9+/]{16,}={0,2})",
          "client-key-data", caseless=True),
    # ~/.netrc: a machine's (or the default's) login, then its password, on its line or the
    # lines after.
    _rule("netrc_password",
          r"\b(?:machine\s+\S+|default)\s+login\s+\S+(?:\s+(?:account|port)\s+\S+)*"
          r"\s+password\s+(?P<secret>\S+)",
          "machine", "default", check=_not_placeholder),
    # ~/.pgpass: host:port:database:user:password, a line of its own (``\:`` escapes a
    # colon); the host has a letter, a dot or *, the port is a number or *.
    _rule("pgpass_password",
          r"(?m)^(?=[^:\s]*[A-Za-z.*])[^:\s]+:(?:\d{1,5}|\*):[^:\s]+:[^:\s]+:"
          r"(?P<secret>(?:[^:\s\\]|\\.)+)[ \t]*\r?$",
          ":", check=_not_placeholder),
    # The password runs to the LAST @ before the host (Pa@ss!w0rd9 is one password); the
    # user may be empty (redis://:<password>@host).
    _rule("url_password",
          r"\b[A-Za-z][A-Za-z0-9+.-]{0,30}://[^\s:/@]{0,256}:(?P<secret>[^\s/?]{1,256})@",
          "://", check=_not_placeholder),
    # mysql's -p with the password joined to it (with a space between, -p asks for it),
    # and the password flags of sshpass (-p) and redis-cli (-a).
    _rule("cli_password",
          r"\b(?i:mysql|mysqldump|mysqladmin|mariadb)\b[^\n]{0,200}?[ \t]-p"
          r"(?:\"(?P<secret>[^\"\n]{1,512})\"|'(?P<secret_single>[^'\n]{1,512})'"
          r"|(?P<secret_bare>[^\s'\"]+))"
          r"|\bsshpass[ \t]+-p[ \t]*(?P<secret_sshpass>[^\s]+)"
          r"|\bredis-cli\b[^\n]{0,200}?[ \t]-a[ \t]+(?P<secret_redis>[^\s]+)"
          # curl's -u (or --user) with a password after the user's colon (else curl asks).
          r"|\bcurl\b[^\n]{0,200}?[ \t](?:-u|--user)(?:[ \t]+|=)?"
          r"(?:'[^'\n:]{0,256}:(?P<secret_curl_single>[^'\n]{1,512})'"
          r"|\"[^\"\n:]{0,256}:(?P<secret_curl_double>[^\"\n]{1,512})\""
          r"|[^\s:\"']{0,256}:(?P<secret_curl>[^\s\"']+))",
          "mysql", "mariadb", "sshpass", "redis-cli", "curl", check=_not_placeholder),
    # --password, --token, --pass and the like, with their value after = or a space.
    _rule("cli_secret_flag",
          r"(?<![\w-])--?(?:pass|password|passwd|passphrase|token|secret|api-key|apikey|"
          r"access-token|auth-token|client-secret|private-key)"
          r"(?:=" + _value(r"[^\s'\"]+") + r"|[ \t]+"
          + _value(r"[^\s'\"]+", "_spaced") + ")",
          "--", "-pass", "-token", "-secret", "-api", "-access", "-auth", "-client",
          "-private", caseless=True, check=_flag_secret),
    _rule("secret_assignment",
          rf"(?P<key>{_SECRET_WORD}){_ASSIGN}" + _value(_BARE_VALUE),
          "secret", "passw", "passphrase", "pwd", "token", "credential", "key",
          caseless=True, check=_assigned_secret),
    # A random-looking value given to a name that may hold one (a key, a signature, a salt,
    # a cookie): its entropy decides.
    _rule("high_entropy_secret",
          r"(?P<key>(?:key|sig|signature|salt|auth|cookie|hmac|seed|nonce|session)s?)"
          rf"(?![A-Za-z0-9_-]){_ASSIGN}" + _value(_BARE_WORD + "{16,}"),
          "key", "sig", "salt", "auth", "cookie", "hmac", "seed", "nonce", "session",
          caseless=True, check=_high_entropy),
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
            text, found = _apply(rule, text, lowered)
            if found:
                counts[rule.name] += found
                lowered = text.lower()
        return Scrubbed(text, dict(counts))
    except Exception as exc:
        raise ScrubError(f"could not scrub secrets: {type(exc).__name__}: {exc}") from exc


_SECRET_KEY = re.compile(_SECRET_WORD + r"\Z", re.IGNORECASE)
"""A key of a JSON object whose name ends with a secret word (``password``, ``apiKey``)."""


def scrub_value(value: Any) -> Any:
    """A JSON value (a message's content: a string, or parts; a tool call's input) with
    every string in it scrubbed, keys kept. A string under a secret-named key is redacted
    whole, as the quoted value after that key in a text would be (``{"password":
    "hunter2"}``: the rule ``secret_assignment``), unless it is a placeholder.

    Raises:
        ScrubError: as `scrub`.
    """
    try:
        return _scrub_value(value)
    except ScrubError:
        raise
    except Exception as exc:
        raise ScrubError(f"could not scrub secrets: {type(exc).__name__}: {exc}") from exc


def _scrub_value(value: Any) -> Any:
    if isinstance(value, str):
        return scrub(value).text
    if isinstance(value, list):
        return [_scrub_value(item) for item in value]
    if isinstance(value, dict):
        return {key: f"{_MARKER}secret_assignment]" if _under_secret_key(key, item)
                else _scrub_value(item) for key, item in value.items()}
    return value


def _under_secret_key(key: Any, item: Any) -> bool:
    """``item`` is a string given to a secret-named key, and no placeholder."""
    return isinstance(key, str) and isinstance(item, str) and bool(item) \
        and _SECRET_KEY.search(key) is not None and not _placeholder(item)


_MARKER = "[REDACTED:"


def _apply(rule: Rule, text: str, lowered: str) -> tuple[str, int]:
    """Redact the rule's matches; a match that is already a marker is left alone."""
    marker = f"{_MARKER}{rule.name}]"
    groups = rule.secret_groups
    if rule.lower_pattern is not None and len(lowered) == len(text):
        matches = rule.lower_pattern.finditer(lowered)
    else:
        matches = rule.pattern.finditer(text)
    pieces: list[str] = []
    done = 0
    found = 0
    for match in matches:
        group = next((name for name in groups if match.start(name) >= 0), 0)
        start, end = match.span(group)
        if text.startswith(_MARKER, start) or (rule.check and not rule.check(Found(text, match))):
            continue
        pieces += [text[done:start], marker]
        done = end
        found += 1
    return ("".join(pieces) + text[done:] if found else text), found


__all__ = ["RULES", "Found", "Rule", "ScrubError", "Scrubbed", "scrub", "scrub_value"]
