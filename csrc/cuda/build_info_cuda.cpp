#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <string>

#include "../build_info.h"

namespace cudnn_rnn {

// CUDNN_VERSION is the header the build saw; cudnnGetVersion() is the library loaded at run time
// (linking it here also makes the built object depend on libcudnn).
std::map<std::string, std::string> accelerator_build_info() {
  return {{"cuda", std::to_string(CUDART_VERSION)},
          {"cudnn", std::to_string(CUDNN_VERSION)},
          {"cudnn_runtime", std::to_string(cudnnGetVersion())}};
}

}  // namespace cudnn_rnn
