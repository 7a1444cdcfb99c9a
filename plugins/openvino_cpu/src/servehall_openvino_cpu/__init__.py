"""servehall-openvino-cpu: the OpenVINO GenAI continuous-batching backend for x86 CPUs."""
