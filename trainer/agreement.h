// Ranks agree before they start. Every rank of a job reads its own configuration, data and
// tokenizer; a rank started with another model, seed, batch size or learning rate, or with a
// data file that differs by one caption, would either wait on collectives that never match
// (a hang until parallel.timeout_s) or train silently on something else (ZeRO-1 applying
// another learning rate to its block). So at start-up the ranks compare the resolved
// configuration key by key with rank 0's, and the contents of the data and tokenizer files
// by hash; a difference stops every rank at once, naming the rank and the first key.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "model/model.h"
#include "parallel/communicator.h"
#include "trainer/config.h"

namespace dhp {

// What the ranks must agree on, as (key, value) in a fixed order: every configuration key
// except those that are per process by nature ([log], which only rank 0 writes;
// train.threads and train.adapt_threads, a node's cores), with the data and tokenizer paths
// replaced by their contents' hashes (nodes may hold their own copies).
std::vector<std::pair<std::string, std::string>> agreement_terms(const Config& cfg);

using AgreementTerms = std::vector<std::pair<std::string, std::string>>;

// Throws dhp::Error on every rank when a rank's terms differ from rank 0's:
// "rank 2: its configuration differs from rank 0's: model.dim = 128 there, 64 on rank 0".
// `extra` adds terms that are not configuration keys: the command line's options that change
// what a run does (--stop-after, --init, --resume). Collective: every rank calls it once,
// before anything else talks to the other ranks.
void check_ranks_agree(const Config& cfg, Communicator& comm, const AgreementTerms& extra = {});

// The same comparison of any terms, for what is known only once the run is set up: the data
// sets' images and clips, the initial weights. `what` names them in the message ("its data or
// weights").
void check_terms_agree(const AgreementTerms& mine, Communicator& comm, const std::string& what);

// A fingerprint of a model's weights as they are now: the first and last 1,024 values of every
// parameter, hashed. Weights loaded from different files differ in every tensor, so this tells
// them apart while reading a few MB, wherever the weights live.
std::string weights_fingerprint(const Model& model);

// train.attention = "auto" (kernels/cuda/attention_select.h): gathers the attention timings
// every rank took since the last call and installs the same choice per shape class on every
// rank. Collective; one integer is reduced when nobody timed anything.
void agree_attention_choices(Backend& backend, Communicator& comm);

}  // namespace dhp
