"""Token mixers other than softmax attention, read exactly: each layer's kind (`kinds`), the implicit attention
map w[head, query, key] of a gated delta rule layer (`delta`), of a Kimi Delta Attention layer (`kda`) and of a
Mamba2 layer (`ssd`), built from the arguments transformers' reference kernels received (`record`, `records`),
every such map of a model with the layers left without one named (`maps`), the output gate of gated softmax
attention (`gates`), and statistics of a signed map, whole or streamed over row blocks with no N x N array
(`stats`). Each kind's heads and state size are read with the other config facts (attnviz.shape.layer_sizes)."""
