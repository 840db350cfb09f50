"""The estimator calculator service: FedEnt's mean-field fixed points over gRPC (``python -m estimator``)."""
