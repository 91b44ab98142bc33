"""`farctx eval`: perplexity (`ppl`), passkey retrieval (`passkey`), out-of-distribution factors (`ood`, recorded by
`ood_recorder` through `tensor_probe`'s graph callback), the texts they read (`data`) and their plots (`plots`).
Plots and the Austen texts need the `eval` extra (matplotlib, rdata)."""
