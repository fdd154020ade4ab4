#include "core/build_info.h"

namespace cudnn_rnn {
std::map<std::string, std::string> accelerator_build_info() { return {{"cuda", "no"}, {"cudnn", "no"}}; }
int64_t cudnn_fallback_count() { return 0; }
void empty_accelerator_caches() {}
}  // namespace cudnn_rnn
