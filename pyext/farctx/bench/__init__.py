"""`farctx bench`: prefill and decode speed of farctx against stock llama.cpp in the same run (`harness`), each
measurement in a process of its own (`worker`: `python -m farctx.bench.worker`)."""
