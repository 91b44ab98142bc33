"""`farctx serve`: an OpenAI-compatible server over N slots of one model (llama-server's flags and shapes).

`server.Server` holds the model, its slots and the one scheduler loop; `app.create_app` the HTTP routes;
`requests` the request bodies; `view` the llama_cpp.Llama face of a request; `scheduler` continuous
batching over a `SequenceBatch`; `sampling` llama.cpp's sampler chain on a logits row; `metrics` /metrics.
These modules need the `serve` extra (fastapi, uvicorn, sse-starlette).
"""
