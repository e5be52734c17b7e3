"""The model-serving proxy: forwards `/<deployment>/...` (or `<deployment>.<domain>`) to the
deployment's healthy replicas, letting through only what its access allows."""
