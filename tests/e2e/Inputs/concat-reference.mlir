// concat.mlir without its split / concat steps (tests/e2e/concat.test).
module attributes {moe.eos_token_ids = array<i64: 2>, moe.max_position_embeddings = 256 : i64, moe.model_type = "mixtral", moe.source = "config.json", moe.unused_tensor_prefixes = ["model.layers."], moe.vocab_size = 251 : i64} {
  func.func @forward(%tokens: tensor<?xi32> {moe.name = "tokens"}, %positions: tensor<?xi32> {moe.name = "positions"}) -> tensor<?x251xf32> {
    %table = moe.weight "model.embed_tokens.weight" : tensor<251x64xf32>
    %x = moe.embedding %table[%tokens] : tensor<251x64xf32>, tensor<?xi32> -> tensor<?x64xf32>
    %w = moe.weight "model.norm.weight" : tensor<64xf32>
    %n = moe.rms_norm %x, %w eps = 9.9999999999999995E-7 : tensor<?x64xf32>, tensor<64xf32>
    %head = moe.weight "lm_head.weight" : tensor<251x64xf32>
    %logits = moe.linear %n, %head : tensor<?x64xf32>, tensor<251x64xf32> -> tensor<?x251xf32>
    return %logits : tensor<?x251xf32>
  }
}
