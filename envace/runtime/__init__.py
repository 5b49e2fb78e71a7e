"""The torch runtime shared by the local engine and local inference: attention kernels (``attention``), the
lean decoder (``lean``), the KV cache (``kv``), batched decoding (``decode``), float32 linear layers
(``gemm``) and bf16/fp32 precision choices (``precision``). It imports only ``envace.core``."""
