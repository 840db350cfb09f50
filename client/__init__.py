"""The fedent worker: ``python -m client --aggregator HOST:PORT --clients 0-9`` hosts simulated clients."""
