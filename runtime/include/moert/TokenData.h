// The token data `moert train --data` reads (docs/training.md): a flat 1-D
// .npy of integer ids (what `moert tokenize --input` writes as
// PREFIX.tokens.npy) or a Megatron indexed dataset (PREFIX.bin +
// PREFIX.idx, `preprocess_data.py`'s output), and the training windows cut
// from it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moert {

/// Every token of `path` in order (a Megatron dataset's sequences joined in
/// index order), each checked to lie in [0, vocab). `path` is FILE.npy, or a
/// Megatron PREFIX (PREFIX.bin or PREFIX.idx also name it). InputError
/// naming the file and what is wrong (header, dtype, shape, size, an id).
std::vector<int32_t> readTokenData(const std::string &path, int64_t vocab);

/// The windows of a token stream: window i is tokens [i * L, i * L + L + 1)
/// (L inputs and the L next tokens, consecutive windows share one token, as
/// Megatron's GPT dataset cuts them); a stream of n tokens holds
/// (n - 1) / L windows.
int64_t windowCount(int64_t tokens, int64_t seqLen);

/// The order of the windows in pass `pass` over W windows: the identity
/// for `seed` < 0, else a Fisher-Yates permutation drawn from SplitMix64
/// seeded with (seed, pass): the same order whatever the machine, the
/// thread count or the layout (docs/training.md, "Data and windows").
std::vector<int64_t> windowOrder(int64_t windows, int64_t seed, int64_t pass);

} // namespace moert
