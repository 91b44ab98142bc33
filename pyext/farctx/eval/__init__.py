"""`farctx eval`: perplexity (`ppl`), needle in a haystack (`niah`, whose sampler `eval passkey` uses too), out-of-distribution factors (`ood`, recorded by
`ood_recorder` through `tensor_probe`'s graph callback), the texts they read (`data`) and their plots (`plots`).
Plots and the Austen texts need the `eval` extra (matplotlib, rdata)."""
