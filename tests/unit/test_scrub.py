"""Secret scrubbing: a fake value for every rule, every format of docs/security.md redacted
whole, near-misses and this repository's own text that must stay, linear time, fail closed."""

import string
from pathlib import Path

import pytest

from ctxd.scrub import RULES, ScrubError, scrub, scrub_value

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
    "azure_sas_signature": (f"https://a.blob.core.windows.net/c?sv=2022-11-02&sig={fake('', 43)}",
                            "https://a.blob.core.windows.net/c?sv=2022-11-02"
                            "&sig=[REDACTED:azure_sas_signature]"),
    "discord_bot_token": (f"bot {fake('MT', 24)}.{fake('G', 5)}.{fake('', 38)} up",
                          "bot [REDACTED:discord_bot_token] up"),
    "vault_token": (f"vault {fake('hvs.', 90)}", "vault [REDACTED:vault_token]"),
    "heroku_api_key": (f"heroku {fake('HRKU-AA', 58)}", "heroku [REDACTED:heroku_api_key]"),
    "mailgun_key": (f"mailgun {fake('key-', 32, HEX)}", "mailgun [REDACTED:mailgun_key]"),
    "twilio_secret": (f"TWILIO_AUTH_TOKEN {fake('', 32, HEX)}",
                      "TWILIO_AUTH_TOKEN [REDACTED:twilio_secret]"),
    "cli_password": ("mysql -u root -pS3cr3t! app", "mysql -u root -p[REDACTED:cli_password] app"),
    "cli_secret_flag": ("deploy --token abc123XYZ --dry-run",
                        "deploy --token [REDACTED:cli_secret_flag] --dry-run"),
    "high_entropy_secret": (f"session_key={fake('', 32)}",
                            "session_key=[REDACTED:high_entropy_secret]"),
    "aws_credentials_csv": ("User name,Password,Console login link\ndeploy,Xy7#pQ!2zR,"
                            "https://123456789012.signin.aws.amazon.com/console",
                            "User name,Password,Console login link\ndeploy,"
                            "[REDACTED:aws_credentials_csv],"
                            "https://123456789012.signin.aws.amazon.com/console"),
    "okta_token": (f"Authorization: SSWS {fake('00', 40)}",
                   "Authorization: SSWS [REDACTED:okta_token]"),
    "kubeconfig_client_key": (f"client-key-data: {fake('LS0tLS1CRUdJTi', 80)}",
                              "client-key-data: [REDACTED:kubeconfig_client_key]"),
    "netrc_password": ("machine github.com login octocat password hunter2hunter2",
                       "machine github.com login octocat password [REDACTED:netrc_password]"),
    "pgpass_password": ("db.internal:5432:app:appuser:Sup3r$ecret!",
                        "db.internal:5432:app:appuser:[REDACTED:pgpass_password]"),
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


# Every format of docs/security.md ("What the scrubber recognises"): (text, scrubbed text).
FORMATS = [
    # Nested YAML: the value goes, not the key; a key alone on its line is no assignment.
    ("credentials:\n  password: PrTOzSJgJMHxPIVh\n  user: deploy",
     "credentials:\n  password: [REDACTED:secret_assignment]\n  user: deploy"),
    ("secrets:\n  db_password: hunter2hunter2\n",
     "secrets:\n  db_password: [REDACTED:secret_assignment]\n"),
    # Quoted values with spaces, whole.
    ('password: "a b c"', 'password: "[REDACTED:secret_assignment]"'),
    ("password: 'correct horse battery'", "password: '[REDACTED:secret_assignment]'"),
    # URLs: a password holding @, an empty user.
    ("postgresql://admin:Pa@ss!w0rd9@db.example.com:5432/app",
     "postgresql://admin:[REDACTED:url_password]@db.example.com:5432/app"),
    ("redis://:s3cretpw@cache:6379/0", "redis://:[REDACTED:url_password]@cache:6379/0"),
    # Vendors' formats.
    (f"VAULT_ADDR=https://vault:8200 {fake('hvs.', 90)}",
     "VAULT_ADDR=https://vault:8200 [REDACTED:vault_token]"),
    (f"heroku {fake('HRKU-AA', 58)}", "heroku [REDACTED:heroku_api_key]"),
    (f"mailgun {fake('key-', 32, HEX)}", "mailgun [REDACTED:mailgun_key]"),
    (f"bot {fake('MT', 24)}.{fake('G', 5)}.{fake('', 38)}", "bot [REDACTED:discord_bot_token]"),
    (f"DD_APP_KEY={fake('', 40, HEX)}", "DD_APP_KEY=[REDACTED:secret_assignment]"),
    ("ENCRYPTION_KEY=kx9Qw2Lm", "ENCRYPTION_KEY=[REDACTED:secret_assignment]"),
    ('{"signing_key": "not so secret"}', '{"signing_key": "[REDACTED:secret_assignment]"}'),
    ("passphrase=correct-horse-battery", "passphrase=[REDACTED:secret_assignment]"),
    (f"https://acct.blob.core.windows.net/c/b?sv=2022-11-02&sp=r&sig={fake('', 43)}%3D",
     "https://acct.blob.core.windows.net/c/b?sv=2022-11-02&sp=r&sig="
     "[REDACTED:azure_sas_signature]"),
    # A bare Twilio or AWS secret after its usual name (a space or a line between).
    (f"TWILIO_AUTH_TOKEN {fake('', 32, HEX)}", "TWILIO_AUTH_TOKEN [REDACTED:twilio_secret]"),
    (f"twilio api secret {fake('SK', 32, HEX)}", "twilio api secret [REDACTED:twilio_secret]"),
    (f"AWS_SECRET_ACCESS_KEY\n{fake('', 40)}",
     "AWS_SECRET_ACCESS_KEY\n[REDACTED:aws_secret_access_key]"),
    (f'"SecretAccessKey": "{fake("", 40)}"',
     '"SecretAccessKey": "[REDACTED:aws_secret_access_key]"'),
    # Command lines.
    ("mysql -u root -pS3cr3t! app < dump.sql",
     "mysql -u root -p[REDACTED:cli_password] app < dump.sql"),
    ("mysqldump -h db -P 3306 -p'two words' app",
     "mysqldump -h db -P 3306 -p'[REDACTED:cli_password]' app"),
    ("sshpass -p hunter2 ssh deploy@host", "sshpass -p [REDACTED:cli_password] ssh deploy@host"),
    ("redis-cli -h cache -a s3cretpw ping", "redis-cli -h cache -a [REDACTED:cli_password] ping"),
    ("deploy --password=hunter2 --user=bob",
     "deploy --password=[REDACTED:cli_secret_flag] --user=bob"),
    ("deploy --token abc123XYZ --dry-run", "deploy --token [REDACTED:cli_secret_flag] --dry-run"),
    ('deploy --password "a b c"', 'deploy --password "[REDACTED:cli_secret_flag]"'),
    # JSON, TOML, .env, JSON inside a JSON string, camelCase.
    ('{"password": "hunter2", "api_key": "k-9 8 7"}',
     '{"password": "[REDACTED:secret_assignment]", "api_key": "[REDACTED:secret_assignment]"}'),
    ('password = "hunter2"\napi_key = "toml-key-1"',
     'password = "[REDACTED:secret_assignment]"\napi_key = "[REDACTED:secret_assignment]"'),
    ("export DB_PASSWORD=hunter2\nAPI_TOKEN=abcdef",
     "export DB_PASSWORD=[REDACTED:secret_assignment]\nAPI_TOKEN=[REDACTED:secret_assignment]"),
    ('{\\"password\\": \\"hunter22\\"}', '{\\"password\\": \\"[REDACTED:secret_assignment]\\"}'),
    ("apiKey: Zq8fKd02mVx", "apiKey: [REDACTED:secret_assignment]"),
    ("client_secret: 'a'", "client_secret: '[REDACTED:secret_assignment]'"),
    # A random value after a name that may hold one; a long secret is redacted to its end.
    (f"session_key={fake('', 32)}", "session_key=[REDACTED:high_entropy_secret]"),
    (f"token: {fake('', 3000)} end", "token: [REDACTED:secret_assignment] end"),
    # A letter whose lower case is two characters: the rules run on the text itself.
    ("İstanbul DB_PASSWORD=hunter2 PASSWORD: x9y8z7w6",
     "İstanbul DB_PASSWORD=[REDACTED:secret_assignment] PASSWORD: [REDACTED:secret_assignment]"),
]


AWS_SECRET = fake("", 40, ALNUM + "/+")
# Formats that leaked before (issue "Hardening the new surfaces", part 7), as the tools that
# write them do.
LEAKED_FORMATS = {
    "aws_console_credentials_csv": (
        "User name,Password,Access key ID,Secret access key,Console login link\r\n"
        f"deploy,Xy7#pQ!2zR{{k,{fake('AKIA', 16, string.ascii_uppercase)},{AWS_SECRET},"
        "https://123456789012.signin.aws.amazon.com/console\r\n",
        "User name,Password,Access key ID,Secret access key,Console login link\r\n"
        "deploy,[REDACTED:aws_credentials_csv],"
        "https://123456789012.signin.aws.amazon.com/console\r\n"),
    "django_secret_key_with_parenthesis": (
        "DJANGO_SECRET_KEY=django-insecure-7x)k2#v@9m$!8^w%n(q&5e-r_3tb0c*y=j4o6p+l1a\n"
        "DEBUG=False",
        "DJANGO_SECRET_KEY=[REDACTED:secret_assignment]\nDEBUG=False"),
    "kubeconfig_client_key_data": (
        "users:\n- name: admin\n  user:\n"
        f"    client-certificate-data: {fake('LS0tLS1CRUdJTiBDRVJU', 60)}\n"
        f"    client-key-data: {fake('LS0tLS1CRUdJTiBSU0Eg', 120)}=\n",
        "users:\n- name: admin\n  user:\n"
        f"    client-certificate-data: {fake('LS0tLS1CRUdJTiBDRVJU', 60)}\n"
        "    client-key-data: [REDACTED:kubeconfig_client_key]\n"),
    "netrc_password": (
        "machine api.heroku.com\n  login me@example.com\n"
        "  password 01234567-89ab-cdef-0123-456789abcdef\ndefault login anonymous password x@y",
        "machine api.heroku.com\n  login me@example.com\n  password [REDACTED:netrc_password]\n"
        "default login anonymous password [REDACTED:netrc_password]"),
    "pgpass_lines": (
        "db.internal:5432:app:appuser:Sup3r$ecret!\n*:*:*:replicator:r3pl\\:icat0r\n",
        "db.internal:5432:app:appuser:[REDACTED:pgpass_password]\n"
        "*:*:*:replicator:[REDACTED:pgpass_password]\n"),
    "curl_user_password": (
        "curl -sS -u deploy:S3cr3tPass! https://api.example.com/v1/deploy\n"
        "curl --user 'ci:two words' https://x",
        "curl -sS -u deploy:[REDACTED:cli_password] https://api.example.com/v1/deploy\n"
        "curl --user 'ci:[REDACTED:cli_password]' https://x"),
    "okta_ssws_token": (
        f'curl -H "Authorization: SSWS {fake("00", 40, ALNUM + "-_")}" '
        "https://dev-123.okta.com/api/v1/users",
        'curl -H "Authorization: SSWS [REDACTED:okta_token]" '
        "https://dev-123.okta.com/api/v1/users"),
    "putty_private_key": (
        "saved as id.ppk:\nPuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\n"
        "Comment: eddsa-key-20260101\nPublic-Lines: 1\n"
        f"{fake('AAAAC3NzaC1lZDI1NTE5AAAAI', 43)}\nPrivate-Lines: 1\n{fake('AAAAIE', 42)}\n"
        f"Private-MAC: {fake('', 64, HEX)}\nthen loaded it",
        "saved as id.ppk:\n[REDACTED:private_key]\nthen loaded it"),
    "aws_access_keys_csv": (
        f"Access key ID,Secret access key\n{fake('AKIA', 16, string.ascii_uppercase)},{AWS_SECRET}",
        "Access key ID,Secret access key\n[REDACTED:aws_access_key_id],"
        "[REDACTED:aws_credentials_csv]"),
}


@pytest.mark.parametrize("name", sorted(LEAKED_FORMATS))
def test_formats_that_leaked_are_redacted_whole(name: str) -> None:
    text, expected = LEAKED_FORMATS[name]
    result = scrub(text)
    assert result.text == expected
    assert result.total == expected.count("[REDACTED:")


@pytest.mark.parametrize(("text", "expected"), FORMATS)
def test_every_format_is_redacted_whole(text: str, expected: str) -> None:
    result = scrub(text)
    assert result.text == expected
    assert result.total == expected.count("[REDACTED:")


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
    # Code assigns names, not secrets; a name that only starts with a secret word is no key.
    "tokens_used=fold.branch.budget_used\nx.token = tokens\npassword = password_hash",
    'PASSWD = getpass.getpass("password: ")\nERRORTOKEN = token.ERRORTOKEN',
    "return max(a, b, key=HEALTH_ORDER.index)",
    "DB_PASSWORD_FILE=/run/secrets/db and TOKEN_COUNT=12 and secret_key_base_path=/etc/x",
    # Low entropy after a name that may hold a secret; a flag named in prose.
    "cache_key=session_scope_default_value and session=opened_recently_here",
    "pass the --password flag, or --token when asked; mysql -h db -P 3306 -p",
    "credentials:\n  from: the environment\nsecrets:\n  - name: db",
    "postgres://app:${DB_PASSWORD}@db/app and password: '${PW}' and token: '<token>'",
    # Parentheses of code after a secret-named key; a password curl asks for; a machine in
    # prose; lines of colons that are not ~/.pgpass; kubeconfig's certificate (public).
    "password = get_password(user)\nTOKEN = make_token(seed)\nf(token=settings.TOKEN)",
    'curl -u admin https://x and curl -u "$USER:$TOKEN" https://y',
    "the machine learning model's default login flow asks for a password each time",
    "12:30:45:00:done\nroot:x:0:0:root:/root:/bin/bash\nfe80::1:2:3:4",
    "client-certificate-data: LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0t and SSWS is Okta's scheme",
    "User name,Password,Access key ID,Secret access key are the columns of credentials.csv",
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


# Deliberate examples in the docs: a fake key that docs/protocol.md shows being scrubbed.
DOCUMENTED_EXAMPLES = {"docs/protocol.md": {"aws_access_key_id": 1}}


def _own_text() -> dict[str, str]:
    root = Path(__file__).resolve().parents[2]
    files = [root / "README.md", *(path for folder in ("ctxd", "clients", "docs", "man")
                                   for path in sorted((root / folder).rglob("*"))
                                   if path.is_file() and path.suffix in
                                   (".py", ".md", ".sh", ".1", ".5", ".toml", ".txt", ""))]
    return {str(path.relative_to(root)): path.read_text(encoding="utf-8") for path in files}


def test_this_repository_scrubs_to_nothing() -> None:
    """ctxd's own source and docs are ordinary code and prose: no false positives."""
    texts = _own_text()
    assert len(texts) > 50
    assert {"ctxd/scrub.py", "man/ctxd.1", "docs/protocol.md"} <= texts.keys()
    found = {name: result.counts for name, text in texts.items()
             if (result := scrub(text)).total}
    assert found == DOCUMENTED_EXAMPLES


MIB = 1 << 20


def _repeat(unit: str) -> str:
    return (unit * (MIB // len(unit) + 1))[:MIB]


# 1 MiB near-misses of each rule: a pattern that backtracked more than a constant per
# character (nested or unbounded quantifiers followed by a failing test) would take hours on
# these, so the test finishing is the check.
ADVERSARIAL = {
    "quote_never_closed": ('password: "' + _repeat("\\"), 0),
    "url_without_at": ("a://" + _repeat(":"), 0),
    "urls_without_at": (_repeat("a://b:"), 0),
    "mysql_without_p": (_repeat("mysql -"), 0),
    "flags_without_value": (_repeat("--token "), 0),
    "keys_without_value": (_repeat("key="), 0),
    "pem_unterminated": (_repeat("-----BEGIN PRIVATE KEY----"), 1),
    "discord_prefixes": (_repeat("Maaaaaaaaaaaaaaaaaaaaaaaa."), 0),
    "jwt_prefixes": (_repeat("eyJ."), 0),
    "names_without_secret": (_repeat("twilio auth token aws_secret_access_key "), 0),
    "yaml_keys_alone": (_repeat("credentials:\n  "), 0),
    "sas_too_short": (_repeat("&sig=a"), 0),
    "one_long_value": ("token:" + _repeat("aB3"), 1),
    "csv_headers_without_rows": (_repeat("user name,password,access key id,secret access key,"),
                                 0),
    "netrc_without_password": (_repeat("machine a login b "), 0),
    "pgpass_hosts_without_colons": ("x" * MIB + ":1:db:user:", 0),
    "pgpass_short_lines": (_repeat("a:1:b:c:\n"), 0),
    "curl_without_colon": (_repeat("curl -u "), 0),
    "putty_unterminated": (_repeat("PuTTY-User-Key-File-3: "), 1),
    "parentheses_without_words": ("password=a1b2c3" + _repeat("()"), 1),
}


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_scrubbing_a_mebibyte_of_near_misses_finishes(name: str) -> None:
    text, secrets = ADVERSARIAL[name]
    result = scrub(text)
    assert result.total == secrets
    if not secrets:
        assert result.text == text
    if name == "pem_unterminated":
        assert result.text == "[REDACTED:private_key]"


def test_a_json_value_is_scrubbed_with_its_secret_named_keys() -> None:
    """A tool call's input: each string scrubbed, and a string under a secret-named key
    redacted whole, as ``"password": "hunter2"`` in a text is."""
    value = {"command": "mysql -u root -pS3cr3t! app", "password": "hunter2",
             "db": {"apiKey": "k", "tokens": "12", "DB_PASSWORD": "${DB_PASSWORD}"},
             "parts": [{"type": "text", "text": f"t {fake('ghp_', 36)}"}], "n": 3}
    assert scrub_value(value) == {
        "command": "mysql -u root -p[REDACTED:cli_password] app",
        "password": "[REDACTED:secret_assignment]",
        "db": {"apiKey": "[REDACTED:secret_assignment]", "tokens": "12",
               "DB_PASSWORD": "${DB_PASSWORD}"},
        "parts": [{"type": "text", "text": "t [REDACTED:github_token]"}], "n": 3}


def test_a_json_value_that_cannot_be_scrubbed_fails_closed() -> None:
    deep: list[object] = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(ScrubError, match="RecursionError"):
        scrub_value(deep)
