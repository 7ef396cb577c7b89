"""Attention: `sdpa_with_kv_cache` and its ragged form (the step's K and V written into the cache,
then attention over it), attention over given keys and values (`et_vk.sdpa`, `custom_sdpa`, and the
encoders' bmm -> softmax -> bmm that fusion makes one flash-attention kernel),
rotary embeddings, KV-cache writes, the gated delta rule of linear attention, a short convolution's
state in a ragged pass, and the GPU sampler of decode bursts. May import the kernels' top modules."""

from . import gated_delta, kv_cache, kv_cache_sdpa, rope, sdpa, short_conv  # noqa: F401
