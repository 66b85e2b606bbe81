import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "exchange.settings.base")
application = get_wsgi_application()

from exchange.api.ratelimit import start_memory_epoch  # noqa: E402

start_memory_epoch()  # signatures older than the replay store's memory are refused (docs/security.md)
