"""Process-wide helpers every app may use: a dependency's outage logged once (outage.py), the
per-process reference-data cache (ttlcache.py), the embedded mode's in-process beat (scheduler.py).
They import nothing of the project's apps."""
