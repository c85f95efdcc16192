// The mixtral fixture's embedding, final norm and LM head with split and
// concat between them that give the embedding back: split into 40 + 24
// columns, concat the parts swapped (24 + 40), split that (24 + 40) and
// concat the parts in their first order. tests/e2e/concat.test runs it
// against concat-reference.mlir (the same without them).
module attributes {moe.eos_token_ids = array<i64: 2>, moe.max_position_embeddings = 256 : i64, moe.model_type = "mixtral", moe.source = "config.json", moe.unused_tensor_prefixes = ["model.layers."], moe.vocab_size = 251 : i64} {
  func.func @forward(%tokens: tensor<?xi32> {moe.name = "tokens"}, %positions: tensor<?xi32> {moe.name = "positions"}) -> tensor<?x251xf32> {
    %table = moe.weight "model.embed_tokens.weight" : tensor<251x64xf32>
    %x = moe.embedding %table[%tokens] : tensor<251x64xf32>, tensor<?xi32> -> tensor<?x64xf32>
    %a, %b = moe.split %x : tensor<?x64xf32> -> tensor<?x40xf32>, tensor<?x24xf32>
    %swapped = moe.concat %b, %a : tensor<?x24xf32>, tensor<?x40xf32> -> tensor<?x64xf32>
    %b2, %a2 = moe.split %swapped : tensor<?x64xf32> -> tensor<?x24xf32>, tensor<?x40xf32>
    %y = moe.concat %a2, %b2 : tensor<?x40xf32>, tensor<?x24xf32> -> tensor<?x64xf32>
    %w = moe.weight "model.norm.weight" : tensor<64xf32>
    %n = moe.rms_norm %y, %w eps = 9.9999999999999995E-7 : tensor<?x64xf32>, tensor<64xf32>
    %head = moe.weight "lm_head.weight" : tensor<251x64xf32>
    %logits = moe.linear %n, %head : tensor<?x64xf32>, tensor<251x64xf32> -> tensor<?x251xf32>
    return %logits : tensor<?x251xf32>
  }
}
