"""HTTP and websocket in one ASGI application (Daphne)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "exchange.settings.base")
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from exchange.api.ratelimit import start_memory_epoch  # noqa: E402
from exchange.celery import app as celery_app  # noqa: E402
from exchange.runtime.scheduler import start_embedded_scheduler  # noqa: E402
from streams.relay import mark_server_process  # noqa: E402
from streams.routing import websocket_urlpatterns  # noqa: E402

start_embedded_scheduler(app=celery_app)  # periodic jobs in-process when there are no Celery workers
mark_server_process()  # this process holds the websockets: its relay publishes to them
start_memory_epoch()  # signatures older than the replay store's memory are refused (docs/security.md)

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": URLRouter(websocket_urlpatterns),
    }
)
