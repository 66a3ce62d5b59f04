"""Token mixers other than softmax attention, read exactly: the implicit attention map w[head, query, key] of a
gated delta rule layer (`delta`) and of a Mamba2 layer (`ssd`), built from the arguments transformers' reference
kernels received (`record`, `records`)."""
