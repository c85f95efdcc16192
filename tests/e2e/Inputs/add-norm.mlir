// Residual adds read by layer norms (with and without a bias) and an
// rms_norm, on the mixtral fixture's weights: no family we import has a
// layer_norm, so this module is what runs moe.add_norm's layer form end to
// end (tests/e2e/add-norm.test) and its CUDA kernels (tests/cuda/host-add-norm.test).
module attributes {moe.eos_token_ids = array<i64: 2>, moe.max_position_embeddings = 256 : i64, moe.model_type = "mixtral", moe.source = "config.json", moe.unused_tensor_prefixes = ["model.layers."], moe.vocab_size = 251 : i64} {
  func.func @forward(%tokens: tensor<?xi32> {moe.name = "tokens"}, %positions: tensor<?xi32> {moe.name = "positions"}) -> tensor<?x251xf32> {
    %table = moe.weight "model.embed_tokens.weight" : tensor<251x64xf32>
    %x = moe.embedding %table[%tokens] : tensor<251x64xf32>, tensor<?xi32> -> tensor<?x64xf32>
    %wq = moe.weight "model.layers.0.self_attn.q_proj.weight" : tensor<64x64xf32>
    %y = moe.linear %x, %wq : tensor<?x64xf32>, tensor<64x64xf32> -> tensor<?x64xf32>
    %s1 = moe.add %x, %y : tensor<?x64xf32>
    %g1 = moe.weight "model.layers.0.input_layernorm.weight" : tensor<64xf32>
    %b1 = moe.weight "model.layers.0.post_attention_layernorm.weight" : tensor<64xf32>
    %n1 = moe.layer_norm %s1, %g1, %b1 eps = 1.0e-05 : tensor<?x64xf32>, tensor<64xf32>, tensor<64xf32>
    %wo = moe.weight "model.layers.0.self_attn.o_proj.weight" : tensor<64x64xf32>
    %z = moe.linear %n1, %wo : tensor<?x64xf32>, tensor<64x64xf32> -> tensor<?x64xf32>
    %s2 = moe.add %s1, %z : tensor<?x64xf32>
    %g2 = moe.weight "model.layers.1.input_layernorm.weight" : tensor<64xf32>
    %n2 = moe.layer_norm %s2, %g2 eps = 1.0e-06 : tensor<?x64xf32>, tensor<64xf32>
    %s3 = moe.add %s2, %n2 : tensor<?x64xf32>
    %w = moe.weight "model.norm.weight" : tensor<64xf32>
    %n3 = moe.rms_norm %s3, %w eps = 9.9999999999999995E-7 : tensor<?x64xf32>, tensor<64xf32>
    %head = moe.weight "lm_head.weight" : tensor<251x64xf32>
    %logits = moe.linear %n3, %head : tensor<?x64xf32>, tensor<251x64xf32> -> tensor<?x251xf32>
    return %logits : tensor<?x251xf32>
  }
}
