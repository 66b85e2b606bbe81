import decimal

# Money needs more than the default 28 significant digits: balances are NUMERIC(36, 18) and sums of
# them must never round. Every thread created from now on starts from this context.
decimal.DefaultContext.prec = 60
decimal.DefaultContext.traps[decimal.Inexact] = False
decimal.setcontext(decimal.Context(prec=60))

from exchange.celery import app as celery_app  # noqa: E402

__all__ = ("celery_app",)
