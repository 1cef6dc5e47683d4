"""Multi-process deployment on Flower's own runtime: credentials, the Flower App, SuperLink and SuperNode processes."""
