"""The Kubernetes backend: TrainJob (trainjob), PyTorchJob (kubernetes), YAML and REST (kube_io), pods."""
