"""Secret scrubbing: a fake value for every rule, near-misses that must stay, fail closed."""

import string

import pytest

from ctxd.scrub import RULES, ScrubError, scrub

ALNUM = string.ascii_letters + string.digits


def fake(prefix: str, length: int, alphabet: str = ALNUM) -> str:
    """A made-up credential: ``prefix`` then ``length`` characters cycling ``alphabet``."""
    return prefix + "".join(alphabet[i * 7 % len(alphabet)] for i in range(length))


HEX = "0123456789abcdef"
PEM = ("-----BEGIN RSA PRIVATE KEY-----\n" + fake("MIIEow", 64) + "\n" + fake("", 64)
       + "\n-----END RSA PRIVATE KEY-----")

# rule -> (text containing a fake secret, the exact scrubbed text)
CASES = {
    "private_key": (f"key:\n{PEM}\ndone", "key:\n[REDACTED:private_key]\ndone"),
    "aws_access_key_id": (f"id {fake('AKIA', 16, string.ascii_uppercase)} ok",
                          "id [REDACTED:aws_access_key_id] ok"),
    "aws_secret_access_key": (f"aws_secret_access_key = {fake('', 40)}",
                              "aws_secret_access_key = [REDACTED:aws_secret_access_key]"),
    "google_api_key": (f"key={fake('AIza', 35)}&q=1", "key=[REDACTED:google_api_key]&q=1"),
    "google_oauth_secret": (f"client {fake('GOCSPX-', 28)}.",
                            "client [REDACTED:google_oauth_secret]."),
    "azure_storage_key": (f"DefaultEndpointsProtocol=https;AccountKey={fake('', 86)}==;",
                          "DefaultEndpointsProtocol=https;AccountKey=[REDACTED:azure_storage_key];"),
    "github_token": (f"push with {fake('ghp_', 36)} now", "push with [REDACTED:github_token] now"),
    "github_fine_grained_token": (f"t {fake('github_pat_', 82)}",
                                  "t [REDACTED:github_fine_grained_token]"),
    "gitlab_token": (f"t {fake('glpat-', 20)}", "t [REDACTED:gitlab_token]"),
    "slack_token": (f"t {fake('xoxb-', 40)}", "t [REDACTED:slack_token]"),
    "slack_webhook": (f"post to https://hooks.slack.com/services/{fake('T', 8)}/{fake('B', 8)}"
                      f"/{fake('', 24)} ok", "post to [REDACTED:slack_webhook] ok"),
    "discord_webhook": (f"https://discord.com/api/webhooks/123456789/{fake('', 60)}",
                        "[REDACTED:discord_webhook]"),
    "telegram_bot_token": (f"bot 123456789:{fake('AA', 33)} up",
                           "bot [REDACTED:telegram_bot_token] up"),
    "stripe_key": (f"stripe {fake('sk_live_', 24)}", "stripe [REDACTED:stripe_key]"),
    "anthropic_api_key": (f"ANTHROPIC {fake('sk-ant-api03-', 90)}",
                          "ANTHROPIC [REDACTED:anthropic_api_key]"),
    "openai_api_key": (f"openai {fake('sk-proj-', 60)}", "openai [REDACTED:openai_api_key]"),
    "huggingface_token": (f"hub {fake('hf_', 34)}", "hub [REDACTED:huggingface_token]"),
    "npm_token": (f"//registry/:_authToken x {fake('npm_', 36)}",
                  "//registry/:_authToken x [REDACTED:npm_token]"),
    "pypi_token": (f"upload {fake('pypi-AgEIcHlwaS5vcmc', 60)}", "upload [REDACTED:pypi_token]"),
    "sendgrid_key": (f"mail {fake('SG.', 22)}.{fake('', 43)}", "mail [REDACTED:sendgrid_key]"),
    "digitalocean_token": (f"do {fake('dop_v1_', 64, HEX)}", "do [REDACTED:digitalocean_token]"),
    "shopify_token": (f"shop {fake('shpat_', 32, HEX)}", "shop [REDACTED:shopify_token]"),
    "jwt": (f"cookie {fake('eyJ', 20)}.{fake('eyJ', 30)}.{fake('', 43)} end",
            "cookie [REDACTED:jwt] end"),
    "bearer_token": (f"Authorization: Bearer {fake('', 32)}",
                     "Authorization: Bearer [REDACTED:bearer_token]"),
    "basic_auth": ("Authorization: Basic dXNlcjpodW50ZXIy",
                   "Authorization: Basic [REDACTED:basic_auth]"),
    "url_password": ("postgres://app:s3cr3t-pw@db.internal:5432/app",
                     "postgres://app:[REDACTED:url_password]@db.internal:5432/app"),
    "secret_assignment": ('DB_PASSWORD="hunter2hunter2" and api_key: k8s-deploy-77 ok',
                          'DB_PASSWORD="[REDACTED:secret_assignment]" and '
                          "api_key: [REDACTED:secret_assignment] ok"),
}


def test_every_rule_has_a_case() -> None:
    assert sorted(CASES) == sorted(rule.name for rule in RULES)
    assert len(RULES) >= 20


@pytest.mark.parametrize("rule", sorted(CASES))
def test_each_rule_redacts_its_fake_secret(rule: str) -> None:
    text, expected = CASES[rule]
    result = scrub(text)
    assert result.text == expected
    assert result.counts == {rule: expected.count(f"[REDACTED:{rule}]")}


NEAR_MISSES = [
    "The AKIA prefix marks AWS access keys; AKIA123 is too short to be one.",
    "ghp_short is not a token, and neither is github_pat_.",
    "sk-learn, sk-ant, and sk_live_ are just words here.",
    "PASSWORD_MIN_LENGTH=8 and token_count = 42",
    'password = "${DB_PASSWORD}" comes from the environment; token=<your token here>',
    "The bearer of this letter is welcome.",
    "Visit https://example.com/docs@latest for help.",
    "eyJ is how base64 JSON starts, but eyJhbGci alone is no JWT.",
    "-----BEGIN PUBLIC KEY-----\nMIIBIjANBg\n-----END PUBLIC KEY-----",
    "def get_password(user):\n    return vault.read(user)",
    "xox is a game; hf_ is a prefix; npm_ too.",
    "A plain transcript line with no credentials at all.",
]


@pytest.mark.parametrize("text", NEAR_MISSES)
def test_near_misses_stay(text: str) -> None:
    assert scrub(text).text == text
    assert scrub(text).total == 0


def test_several_secrets_are_all_counted() -> None:
    github = fake("ghp_", 36)
    text = f"first {github}, then {github} and Bearer {fake('', 20)}"
    result = scrub(text)
    assert result.text == ("first [REDACTED:github_token], then [REDACTED:github_token] and "
                           "Bearer [REDACTED:bearer_token]")
    assert result.counts == {"github_token": 2, "bearer_token": 1}
    assert result.total == 3


def test_an_unterminated_private_key_is_redacted_to_the_end() -> None:
    truncated = "head\n-----BEGIN OPENSSH PRIVATE KEY-----\n" + fake("b3Blbn", 70)
    assert scrub(truncated).text == "head\n[REDACTED:private_key]"


def test_fails_closed() -> None:
    with pytest.raises(ScrubError, match="expected str, got bytes"):
        scrub(b"ghp_" + b"a" * 36)  # type: ignore[arg-type]


def test_a_secret_is_redacted_and_counted_once() -> None:
    token = fake("ghp_", 36)
    result = scrub(f"git clone https://me:{token}@github.com/x/y; GITHUB_TOKEN={token}")
    assert result.text == ("git clone https://me:[REDACTED:github_token]@github.com/x/y; "
                           "GITHUB_TOKEN=[REDACTED:github_token]")
    assert result.counts == {"github_token": 2}
