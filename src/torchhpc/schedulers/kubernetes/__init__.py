"""The Kubernetes backend: TrainJob (trainjob), PyTorchJob (kubernetes), the YAML emitter (yaml_text), the REST client (rest), pods."""
