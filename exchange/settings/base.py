"""Settings read from the environment (django-environ).

Without any environment the service runs embedded: SQLite under var/, in-memory rate limits and
channel layer, Celery tasks executed eagerly in-process. With DATABASE_URL and REDIS_URL it runs
on PostgreSQL and Redis with real Celery workers.
"""

from decimal import Decimal
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

import environ

BASE_DIR = Path(__file__).resolve().parent.parent.parent
VAR_DIR = BASE_DIR / "var"
VAR_DIR.mkdir(exist_ok=True)

env = environ.Env()
if (BASE_DIR / ".env").exists():
    environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

# Development fallback only; production.py refuses to start with it.
INSECURE_DEFAULT_SECRET_KEY = "insecure-development-key-change-me-0123456789abcdefghijklmnop"  # noqa: S105
SECRET_KEY = env.str("SECRET_KEY", default=INSECURE_DEFAULT_SECRET_KEY)
DEBUG = env.bool("DEBUG", default=False)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "testserver"])
# Proxies whose X-Forwarded-For we believe (addresses or CIDR networks).
TRUSTED_PROXIES = env.list("TRUSTED_PROXIES", default=[])
PORT = env.int("PORT", default=8000)

# Fernet keys (comma separated, newest first) that encrypt API secrets at rest. When unset a key
# is derived from SECRET_KEY, which is fine for development only.
API_SECRET_ENCRYPTION_KEYS = env.list("API_SECRET_ENCRYPTION_KEYS", default=[])

IP_WEIGHT_LIMIT_PER_MINUTE = env.int("IP_WEIGHT_LIMIT_PER_MINUTE", default=120)
UID_WEIGHT_LIMIT_PER_MINUTE = env.int("UID_WEIGHT_LIMIT_PER_MINUTE", default=180)
RATE_LIMIT_BAN_MIN_SECONDS = env.int("RATE_LIMIT_BAN_MIN_SECONDS", default=120)
RATE_LIMIT_BAN_MAX_SECONDS = env.int("RATE_LIMIT_BAN_MAX_SECONDS", default=3 * 24 * 3600)
LISTEN_KEY_TTL_SECONDS = env.int("LISTEN_KEY_TTL_SECONDS", default=3600)
LISTEN_KEY_CREATE_LIMIT_PER_HOUR = env.int("LISTEN_KEY_CREATE_LIMIT_PER_HOUR", default=60)
# Request size (docs/api.md, "Request size"; nginx in harness/, the full stack, refuses the same earlier): a
# signed /openapi/ request's body and query string; Django's own bound on any body it reads (the
# admin's forms included) and on the fields of a form it parses.
API_MAX_BODY_BYTES = env.int("API_MAX_BODY_BYTES", default=16 * 1024)
API_MAX_QUERY_BYTES = env.int("API_MAX_QUERY_BYTES", default=8 * 1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = env.int("DATA_UPLOAD_MAX_MEMORY_SIZE", default=64 * 1024)
DATA_UPLOAD_MAX_NUMBER_FIELDS = env.int("DATA_UPLOAD_MAX_NUMBER_FIELDS", default=1000)
STREAM_MAX_STREAMS_PER_CONNECTION = 1024
# Websocket bounds (docs/streams.md): connections per listenKey and per client IP (across every
# server process), client messages per second per connection, longest client message. A server
# process shares each account's events among its connections (one copy from Redis, frames built
# once), so many connections on one listenKey cost little more than one.
STREAM_MAX_CONNECTIONS_PER_KEY = env.int("STREAM_MAX_CONNECTIONS_PER_KEY", default=64)
STREAM_MAX_CONNECTIONS_PER_IP = env.int("STREAM_MAX_CONNECTIONS_PER_IP", default=100)
STREAM_MESSAGES_PER_SECOND = env.float("STREAM_MESSAGES_PER_SECOND", default=5.0)
STREAM_MAX_MESSAGE_CHARS = env.int("STREAM_MAX_MESSAGE_CHARS", default=100_000)
STREAM_MAX_CONNECTION_SECONDS = env.int("STREAM_MAX_CONNECTION_SECONDS", default=24 * 3600)
# How often a connection re-checks that its listenKeys are alive (expiry closes the stream).
STREAM_KEY_CHECK_SECONDS = env.float("STREAM_KEY_CHECK_SECONDS", default=5.0)
# How often each server's watcher reads the store's revocation counter (one GET), checking every
# connection's keys at once when a key was deleted anywhere: closes bounded even when the
# channel-layer message that closes them is lost.
STREAM_REVOCATION_CHECK_SECONDS = env.float("STREAM_REVOCATION_CHECK_SECONDS", default=0.25)
# The relay's sweeper: how often it looks for change-feed rows nobody published, and how old they
# must be (the committing process publishes its own at once; this catches crashes and, in the
# embedded default, postings made by other processes).
STREAM_SWEEP_SECONDS = env.float("STREAM_SWEEP_SECONDS", default=0.25)
STREAM_SWEEP_GRACE_SECONDS = env.float("STREAM_SWEEP_GRACE_SECONDS", default=0.2)
STREAM_SWEEPER_ENABLED = env.bool("STREAM_SWEEPER_ENABLED", default=True)
# Events of one account committed by several processes may arrive out of sequence: a server process
# waits this long for the missing ones before it reads them from the database (a real gap).
STREAM_GAP_WAIT_SECONDS = env.float("STREAM_GAP_WAIT_SECONDS", default=0.2)
# Frames waiting to be sent to one connection; a connection that falls this far behind is closed
# (4006) so that it reconnects and resyncs instead of lagging without bound.
STREAM_MAX_PENDING_FRAMES = env.int("STREAM_MAX_PENDING_FRAMES", default=2000)
# How long a frame may wait in the server (not yet handed to the socket) before its connection is
# closed (4006): a connection that cannot keep up is cut off, never silently seconds late, and one
# account's fan-out cannot hold the process's other accounts behind it (docs/streams.md, Delivery).
STREAM_MAX_LAG_SECONDS = env.float("STREAM_MAX_LAG_SECONDS", default=1.0)
# How long a process may use its cached copy of an account's API keys when the Redis invalidation
# message is lost (accounts/keyring.py); changes made through the ORM evict at once.
API_KEY_CACHE_SECONDS = env.int("API_KEY_CACHE_SECONDS", default=10)
API_KEY_REVOCATION_SECONDS = env.float("API_KEY_REVOCATION_SECONDS", default=1.0)
# The same for reference data cached per process (convert's pairs and markets, the business status,
# assets, transfer fees, limit tiers; exchange/runtime/ttlcache.py ReferenceCache): a change reaches every
# process within the revocation bound, and a cached value is reloaded at the latest this long after its load.
REFERENCE_CACHE_SECONDS = env.float("REFERENCE_CACHE_SECONDS", default=10.0)
REFERENCE_REVOCATION_SECONDS = env.float("REFERENCE_REVOCATION_SECONDS", default=1.0)

REDIS_URL = env.str("REDIS_URL", default="")
# Redis through Sentinel (docs/scaling.md): REDIS_SENTINELS="h1:26379,h2:26379,h3:26379" and the
# primary's name REDIS_SENTINEL_MASTER. Every client then asks the sentinels for the primary at each
# connection (exchange/runtime/redis_clients.py, and the channel layer, broker and limits below);
# REDIS_URL names only the database and password (its host is not dialled; default redis://MASTER/0).
REDIS_SENTINELS = [
    (host.rpartition(":")[0], int(host.rpartition(":")[2])) for host in env.list("REDIS_SENTINELS", default=[])
]
REDIS_SENTINEL_MASTER = env.str("REDIS_SENTINEL_MASTER", default="mymaster")
if REDIS_SENTINELS and not REDIS_URL:
    REDIS_URL = f"redis://{REDIS_SENTINEL_MASTER}/0"
_REDIS_DB = int(urlsplit(REDIS_URL).path.strip("/") or 0)
# Redis's password (`requirepass`) is REDIS_URL's, with or without Sentinel. The sentinels may have
# one of their own (their `requirepass`): REDIS_SENTINEL_PASSWORD, empty when they have none. Every
# Sentinel client sends the sentinels this dictionary (redis-py's sentinel_kwargs); "password" is
# always present so that no library sends the sentinels Redis's password instead (limits does so by
# default with a URL password).
_REDIS_PASSWORD = unquote(urlsplit(REDIS_URL).password or "") or None
REDIS_SENTINEL_PASSWORD = env.str("REDIS_SENTINEL_PASSWORD", default="")
REDIS_SENTINEL_KWARGS = {
    "socket_timeout": 1.0,  # a dead sentinel is skipped for the next quickly
    "socket_connect_timeout": 1.0,
    "password": REDIS_SENTINEL_PASSWORD or None,
}
_SENTINEL_HOSTS = ",".join(f"{host}:{port}" for host, port in REDIS_SENTINELS)
_AUTH = f":{quote(_REDIS_PASSWORD, safe='')}@" if _REDIS_PASSWORD else ""
# Where the rate-limit counters live: Redis when configured, else this process's memory.
RATE_LIMIT_STORAGE_URL = env.str(
    "RATE_LIMIT_STORAGE_URL",
    default=(f"redis+sentinel://{_AUTH}{_SENTINEL_HOSTS}/{REDIS_SENTINEL_MASTER}" if REDIS_SENTINELS else REDIS_URL)
    or "memory://",
)

INSTALLED_APPS = [
    "daphne",
    "exchange.dashboard.apps.OperationsAdminConfig",  # django.contrib.admin, home on the dashboard
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "exchange.platform",  # app label "exchange": business status, and every model labelled so
    "exchange.backoffice",  # staff tools: audit trail, four-eyes changes, roles, the admin's safety
    "accounts",
    "wallet",
    "convert",
    "subaccounts",
    "streams",
    "exchange.dashboard.apps.DashboardConfig",  # the back office's read side: above every app
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "exchange.api.middleware.ClientIpMiddleware",
    "exchange.backoffice.toolkit.AdminHostsMiddleware",  # before the session: a 404 costs no session lookup
    # Django's session, CSRF, auth and messages middleware, kept off the API's paths (they serve the
    # admin; the gateway authenticates API requests itself): see exchange/api/middleware.py.
    "exchange.api.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "exchange.api.middleware.CsrfViewMiddleware",
    "exchange.api.middleware.AuthenticationMiddleware",
    "exchange.api.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

# The back office (docs/operations.md, "Staff sessions and the admin's safety"). Only staff have
# sessions (the API authenticates every request with its key): a staff session ends 8 hours after
# login and when the browser closes, whichever comes first.
SESSION_COOKIE_AGE = env.int("STAFF_SESSION_SECONDS", default=8 * 3600)
SESSION_EXPIRE_AT_BROWSER_CLOSE = True
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_HTTPONLY = True
# Hosts (names as in the Host header, without port) on which the admin answers; elsewhere, the
# public API's hosts above all, /admin/ is a 404. Empty: every host in ALLOWED_HOSTS.
ADMIN_HOSTS = env.list("ADMIN_HOSTS", default=[])
# Failed admin logins allowed per client IP and per username (e-mail) within the window; further
# attempts are refused with a message, correct password or not, until the window has passed.
ADMIN_LOGIN_FAILURES_PER_IP = env.int("ADMIN_LOGIN_FAILURES_PER_IP", default=20)
ADMIN_LOGIN_FAILURES_PER_USERNAME = env.int("ADMIN_LOGIN_FAILURES_PER_USERNAME", default=5)
ADMIN_LOGIN_WINDOW_SECONDS = env.int("ADMIN_LOGIN_WINDOW_SECONDS", default=15 * 60)

ROOT_URLCONF = "exchange.urls"
WSGI_APPLICATION = "exchange.wsgi.application"
ASGI_APPLICATION = "exchange.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        # The back office's overrides of the admin's own templates: searched before the admin app's.
        "DIRS": [BASE_DIR / "exchange" / "dashboard" / "templates", BASE_DIR / "exchange" / "backoffice" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{VAR_DIR / 'exchange.sqlite3'}")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # One writer at a time, taken at BEGIN, so two transactions never deadlock upgrading locks.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"transaction_mode": "IMMEDIATE", "timeout": 20, "init_command": "PRAGMA journal_mode=WAL;"}
    )
else:
    # A bounded pool of connections per process (psycopg_pool through Django's `pool` option;
    # docs/operations.md, "Database connections"): at most DB_POOL_MAX_SIZE, so that the sum over
    # every process stays under PostgreSQL's max_connections at any load. A thread borrows one for a
    # request (or a task, or a websocket's query) and gives it back at the end; one that cannot get a
    # connection within DB_POOL_TIMEOUT seconds fails the request with -1001 (HTTP 503), never a 500.
    # DB_POOL=false: one connection per thread kept CONN_MAX_AGE seconds (Django's classic way).
    if env.bool("DB_POOL", default=True):
        DATABASES["default"]["CONN_MAX_AGE"] = 0  # the pool keeps them
        pool = {
            "min_size": env.int("DB_POOL_MIN_SIZE", default=1),
            "max_size": env.int("DB_POOL_MAX_SIZE", default=8),
            "timeout": env.float("DB_POOL_TIMEOUT", default=5.0),
            "max_idle": env.float("DB_POOL_MAX_IDLE", default=300.0),
            "max_lifetime": env.float("DB_POOL_MAX_LIFETIME", default=3600.0),
            # A broken connection (the database restarted) is found by the pool's background check
            # only when returned; with DB_HEALTH_CHECKS each borrow is checked first (one round trip).
            "reconnect_timeout": env.float("DB_POOL_RECONNECT_TIMEOUT", default=300.0),
        }
        # Django hands the pool its check itself (ConnectionPool.check_connection) when
        # CONN_HEALTH_CHECKS is on; a "check" in the pool's options as well fails every connect.
        DATABASES["default"]["CONN_HEALTH_CHECKS"] = env.bool("DB_HEALTH_CHECKS", default=False)
        DATABASES["default"].setdefault("OPTIONS", {})["pool"] = pool
    else:
        DATABASES["default"]["CONN_MAX_AGE"] = env.int("CONN_MAX_AGE", default=60)
        # Off by default: a `SELECT 1` round trip on every request that reuses a connection. Without
        # it a restarted database costs one failed request per kept connection (docs/operations.md).
        DATABASES["default"]["CONN_HEALTH_CHECKS"] = env.bool("DB_HEALTH_CHECKS", default=False)
    # The ledger's hot statements are prepared (parsed and planned once per connection); Django's
    # own queries bind client-side and are never prepared. Off behind a transaction-mode pooler that
    # cannot keep prepared statements (DB_PREPARED_STATEMENTS=false; docs/operations.md).
    if env.bool("DB_PREPARED_STATEMENTS", default=True):
        DATABASES["default"].setdefault("OPTIONS", {})["prepare_threshold"] = 5
DATABASES["default"]["ATOMIC_REQUESTS"] = False  # services own their transactions

# --- Reads of history on a replica (docs/scaling.md, "Reads of history on replicas") ---------------
# DATABASE_REPLICA_URL: a hot standby (or every node, libpq multi-host with
# target_session_attrs=prefer-standby) that the history selectors may read through
# exchange/runtime/replicas.py; unset, every query stays on the primary. The alias is never written
# to, never migrated, and read only where a selector asks for it (no router).
DATABASE_REPLICA_URL = env.str("DATABASE_REPLICA_URL", default="")
# The lag guard: the replica is read only while its replay lag is below this (seconds), looked at
# once per REPLICA_CHECK_SECONDS per process; a replica that fails is skipped REPLICA_DOWN_SECONDS.
REPLICA_MAX_LAG_SECONDS = env.float("REPLICA_MAX_LAG_SECONDS", default=5.0)
REPLICA_CHECK_SECONDS = env.float("REPLICA_CHECK_SECONDS", default=1.0)
REPLICA_DOWN_SECONDS = env.float("REPLICA_DOWN_SECONDS", default=5.0)
# The sticky rule: an account that posted within this many seconds reads its history on the primary.
# Never below the lag bound plus the check interval, or an account could miss its own write.
REPLICA_STICKY_SECONDS = max(
    env.float("REPLICA_STICKY_SECONDS", default=0.0), REPLICA_MAX_LAG_SECONDS + REPLICA_CHECK_SECONDS
)
if DATABASE_REPLICA_URL:
    DATABASES["replica"] = env.db_url_config(DATABASE_REPLICA_URL)
    DATABASES["replica"].setdefault("OPTIONS", {}).setdefault("connect_timeout", 2)
    if "pool" in DATABASES["default"].get("OPTIONS", {}):
        # A replica that is away costs a read at most this long before it runs on the primary.
        DATABASES["replica"]["OPTIONS"]["pool"] = DATABASES["default"]["OPTIONS"]["pool"] | {"timeout": 2.0}
        DATABASES["replica"]["CONN_MAX_AGE"] = 0
    else:
        DATABASES["replica"]["CONN_MAX_AGE"] = DATABASES["default"].get("CONN_MAX_AGE", 0)
    DATABASES["replica"]["ATOMIC_REQUESTS"] = False
    # Tests never create or flush it: it shows the primary's test database through replication.
    DATABASES["replica"]["TEST"] = {"MIRROR": "default"}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_USER_MODEL = "accounts.User"
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
STATIC_ROOT.mkdir(exist_ok=True)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

# The gateway (exchange/api) does parameters, authentication, permissions and throttling itself;
# DRF only routes, renders and hands exceptions to our handler.
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": [],
    "DEFAULT_THROTTLE_CLASSES": [],
    "DEFAULT_PARSER_CLASSES": [],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "EXCEPTION_HANDLER": "exchange.api.errors.exception_handler",
    "UNAUTHENTICATED_USER": None,
    "DEFAULT_SCHEMA_CLASS": "exchange.api.schema.GatewayAutoSchema",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Exchange account service API",
    "DESCRIPTION": (
        "REST interface of the exchange account service. Signed endpoints (TRADE, USER_DATA) need the "
        "X-SERVICE-APIKEY header, a `timestamp` and a `signature` (hex HMAC-SHA256 of totalParams "
        "keyed with the secret). See docs/api.md in the repository for the signing rules."
    ),
    "VERSION": "2025-06-20",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "APPEND_COMPONENTS": {
        "securitySchemes": {
            "ApiKey": {"type": "apiKey", "in": "header", "name": "X-SERVICE-APIKEY"},
        }
    },
}

# Celery: eager in the embedded default, Redis broker in the full stack.
CELERY_BROKER_URL = env.str(
    "CELERY_BROKER_URL",
    default=(";".join(f"sentinel://{_AUTH}{host}:{port}/{_REDIS_DB}" for host, port in REDIS_SENTINELS) or REDIS_URL)
    or "memory://",
)
if REDIS_SENTINELS:
    # kombu's Sentinel transport: the primary's name; the URL's password is Redis's (kombu gives it
    # to the primary only), the sentinels get theirs in sentinel_kwargs.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"master_name": REDIS_SENTINEL_MASTER, "sentinel_kwargs": REDIS_SENTINEL_KWARGS}
CELERY_RESULT_BACKEND = None
CELERY_TASK_ALWAYS_EAGER = env.bool("CELERY_TASK_ALWAYS_EAGER", default=not REDIS_URL)
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_TIME_LIMIT = 300
CELERY_TASK_SOFT_TIME_LIMIT = 240
# Wallet: the chain adapter (dotted path), the simulator's block time, travel rule and approvals.
CHAIN_ADAPTER = env.str("CHAIN_ADAPTER", default="wallet.chain.simulator.SimulatedChain")
SIM_CHAIN_BLOCK_SECONDS = env.float("SIM_CHAIN_BLOCK_SECONDS", default=5.0)
CHAIN_SCAN_SECONDS = env.float("CHAIN_SCAN_SECONDS", default=2.0)
# Deposits worth at least this much (in PHP at the asset's reference price) wait for travel-rule
# data that operators fill in (status NEED_FILL_DATA); 0 disables the rule.
TRAVEL_RULE_THRESHOLD = Decimal(env.str("TRAVEL_RULE_THRESHOLD", default="50000"))
# Withdrawals worth more than this (PHP at reference price, amount plus fee) wait for an operator's
# approval (wallet/approvals.py; WITHDRAWAL_FOUR_EYES_ABOVE may not be below it: a system check).
WITHDRAWAL_APPROVAL_THRESHOLD = Decimal(env.str("WITHDRAWAL_APPROVAL_THRESHOLD", default="1000000"))
# Four eyes: approving a withdrawal worth more than this (PHP at reference price, amount plus fee)
# takes two staff members, the second not the first (wallet/approvals.py). Empty: never.
_FOUR_EYES_ABOVE = env.str("WITHDRAWAL_FOUR_EYES_ABOVE", default="5000000")
WITHDRAWAL_FOUR_EYES_ABOVE = Decimal(_FOUR_EYES_ABOVE) if _FOUR_EYES_ABOVE else None
# The same two approvals when one customer's withdrawals of the last 24 hours (every one not failed or
# rejected, the one being approved included, each valued like the threshold: amount plus fee in PHP)
# add up to more than WITHDRAWAL_FOUR_EYES_ABOVE: a large sum split into pieces below it (issue 34).
WITHDRAWAL_FOUR_EYES_WINDOW_HOURS = env.int("WITHDRAWAL_FOUR_EYES_WINDOW_HOURS", default=24)
# Reversing a P2P transfer worth more than this (PHP at reference price, amount plus fee) takes two
# Administrators, the second not the first (wallet.transfers.services.transfer_reverse). 0, the
# default: every reversal, as every manual adjustment (issue 34, finding 2).
TRANSFER_REVERSAL_FOUR_EYES_ABOVE = Decimal(env.str("TRANSFER_REVERSAL_FOUR_EYES_ABOVE", default="0"))
# A withdrawal still broadcasting after this long is handed to a worker again.
WITHDRAWAL_RETRY_AFTER_SECONDS = env.int("WITHDRAWAL_RETRY_AFTER_SECONDS", default=120)

# Convert (docs/convert.md): quotes, prices, the house's liquidity.
QUOTE_TTL_SECONDS = env.int("QUOTE_TTL_SECONDS", default=10)
CONVERT_QUOTE_INTERVAL_MS = env.int("CONVERT_QUOTE_INTERVAL_MS", default=1000)  # per account and pair
CONVERT_PRICE_SOURCE = env.str("CONVERT_PRICE_SOURCE", default="convert.prices.ReferencePrices")
CONVERT_MARKET_TICK_SECONDS = env.float("CONVERT_MARKET_TICK_SECONDS", default=5.0)
CONVERT_PRICE_MAX_AGE_SECONDS = env.float("CONVERT_PRICE_MAX_AGE_SECONDS", default=30.0)
# Last look: an accept is refused when the customer's price has fallen by more than this since the quote
# (and always when the quote's price is above the market's price now).
CONVERT_LAST_LOOK_TOLERANCE_BPS = env.int("CONVERT_LAST_LOOK_TOLERANCE_BPS", default=50)
# Every asset has one price in this asset; every market's price is derived from two of them.
CONVERT_NUMERAIRE = env.str("CONVERT_NUMERAIRE", default="PHP")
# The guard: quoting stops (and an error is logged) while some cycle of conversions at the customers'
# prices would return more than this above what it started with. 0: no cycle may gain anything.
CONVERT_ARBITRAGE_TOLERANCE_BPS = env.int("CONVERT_ARBITRAGE_TOLERANCE_BPS", default=0)
# House roles split over several ledger accounts so that postings of different customers do not
# queue on one lock (accounts/ledger/system.py). Roles not named have one account.
HOUSE_ACCOUNT_SHARDS = {
    "convert_liquidity": env.int("CONVERT_LIQUIDITY_SHARDS", default=16),
    "world": env.int("WORLD_SHARDS", default=16),
    "fees": env.int("FEES_SHARDS", default=16),
}

# A fund collection still INIT or PROCESSING this long after its last change is handed to a worker
# again by the beat's sweep (a worker killed mid-task; docs/subaccounts.md, "Fund collection").
FUND_COLLECTION_RETRY_AFTER_SECONDS = env.float("FUND_COLLECTION_RETRY_AFTER_SECONDS", default=60.0)

CELERY_BEAT_SCHEDULE: dict = {
    "ledger-check": {"task": "accounts.ledger_check", "schedule": env.float("LEDGER_CHECK_SECONDS", default=3600.0)},
    "sim-chain-blocks": {"task": "wallet.sim_advance_blocks", "schedule": SIM_CHAIN_BLOCK_SECONDS},
    "chain-scan": {"task": "wallet.scan_deposits", "schedule": CHAIN_SCAN_SECONDS},
    "withdrawal-retry": {"task": "wallet.retry_stuck_withdrawals", "schedule": 30.0},
    "convert-market-tick": {"task": "convert.market_tick", "schedule": CONVERT_MARKET_TICK_SECONDS},
    "fund-collection-retry": {"task": "subaccounts.retry_stuck_collections", "schedule": 30.0},
    # The dashboard's daily activity (exchange/dashboard/activity.py): folds postings older than
    # DASHBOARD_ROLLUP_LAG_SECONDS into per-day counters.
    "activity-rollup": {
        "task": "exchange.activity_rollup",
        "schedule": env.float("DASHBOARD_ROLLUP_SECONDS", default=60.0),
    },
}
# Where the beat keeps the schedule. Celery's default (a file of the beat's own) for one host; on
# several app hosts (docs/scaling.md) every host runs a beat with CELERY_BEAT_SCHEDULER=
# "redbeat.RedBeatScheduler" (celery-redbeat): the schedule lives in Redis and a beat sends tasks only
# while it holds RedBeat's lock there; the others wait for it (polling every REDBEAT_POLL_SECONDS).
# A dead holder stops extending the lock, which expires after REDBEAT_LOCK_TIMEOUT_SECONDS: the
# takeover window is that plus at most one poll.
CELERY_BEAT_SCHEDULER = env.str("CELERY_BEAT_SCHEDULER", default="celery.beat:PersistentScheduler")
if "redbeat" in CELERY_BEAT_SCHEDULER.lower():
    # The holder extends the lock at every tick: ticks at least this often keep it well inside its timeout.
    CELERY_BEAT_MAX_LOOP_INTERVAL = env.float("REDBEAT_POLL_SECONDS", default=1.0)
    CELERY_REDBEAT_LOCK_TIMEOUT = env.int("REDBEAT_LOCK_TIMEOUT_SECONDS", default=10)
    CELERY_REDBEAT_KEY_PREFIX = "redbeat:"
    if REDIS_SENTINELS:
        # RedBeat's own Sentinel client (it does not read kombu's sentinel:// URL): the lock and the
        # schedule on the primary the sentinels name.
        CELERY_REDBEAT_REDIS_URL = "redis-sentinel://"
        CELERY_REDBEAT_REDIS_OPTIONS = {
            "sentinels": REDIS_SENTINELS,
            "service_name": REDIS_SENTINEL_MASTER,
            "db": _REDIS_DB,
            "password": _REDIS_PASSWORD,
            "socket_timeout": 2.0,
            "sentinel_kwargs": REDIS_SENTINEL_KWARGS,
            "retry_period": 5,  # a Sentinel failover (docs/scaling.md: a few seconds) is retried, not fatal
        }
    else:
        CELERY_REDBEAT_REDIS_URL = REDIS_URL
        CELERY_REDBEAT_REDIS_OPTIONS: dict = {}
# In the embedded default a thread of the server runs the schedule above (exchange/runtime/scheduler.py).
EMBEDDED_SCHEDULER = env.bool("EMBEDDED_SCHEDULER", default=True)

# `manage.py demo`: each app loads its own part of the demo world, in this order (an app's part may
# use the ones before it). Each returns the demo accounts it adds, by role, for `--json`.
DEMO_LOADERS = ["accounts.demo.load", "wallet.demo.load", "convert.demo.load", "subaccounts.demo.load"]

if REDIS_URL:
    # A slow consumer's channel holds up to STREAM_CHANNEL_CAPACITY messages; beyond that channels_redis
    # drops them and the consumer's periodic catch-up reads the change feed instead.
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {
                # redis-py's 5 s socket timeout equals the layer's 5 s blocking read: quiet
                # connections would die; its pool of 100 refuses a reconnect storm.
                "hosts": [
                    {"address": REDIS_URL, "socket_timeout": 15, "max_connections": 1000}
                    if not REDIS_SENTINELS
                    else {
                        "sentinels": REDIS_SENTINELS,
                        "master_name": REDIS_SENTINEL_MASTER,
                        "sentinel_kwargs": REDIS_SENTINEL_KWARGS,
                        "db": _REDIS_DB,
                        "password": _REDIS_PASSWORD,
                        "socket_timeout": 15,
                        "max_connections": 1000,
                    }
                ],
                "capacity": env.int("STREAM_CHANNEL_CAPACITY", default=5000),
            },
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "filters": {"without_503": {"()": "exchange.runtime.outage.WithoutServiceUnavailable"}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
    "loggers": {
        # Django logs every 4xx with the path; our envelope already tells the client why. A 503 is a
        # refusal while a dependency is away: exchange/runtime/outage.py logs the outage, not each request.
        "django.request": {"level": "ERROR", "filters": ["without_503"]},
        "django.server": {"level": "WARNING"},
        # One line per periodic task every few seconds drowns everything else; failures still log.
        "celery.app.trace": {"level": "WARNING"},
    },
}
# Virtual sub-accounts get their addresses in this domain's own space (`<name>_<domain>@m<master
# id>.<this>`, subaccounts/addresses.py); nobody may register an e-mail in it or under it
# (accounts.services.address_is_reserved). `.invalid` (RFC 2606) can never be a real mailbox.
VIRTUAL_SUB_ACCOUNT_DOMAIN = env.str("VIRTUAL_SUB_ACCOUNT_DOMAIN", default="virtual.invalid").strip().lower()
