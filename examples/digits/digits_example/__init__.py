"""fedent plug-in example: a small CNN, scikit-learn's bundled 8x8 digits and FedAvg with server momentum."""
