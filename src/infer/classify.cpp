// Image classification: probabilities, accuracy with a confusion matrix, and
// the typed model-folder reader.
#include <algorithm>
#include <numeric>

#include "qkv/checkpoint.h"
#include "qkv/infer.h"

namespace qkv {

Tensor classify_images(VisionTransformer& model, const Tensor& images) {
  NoGradGuard no_grad;
  return softmax(model.forward(images));
}

VitEvaluation evaluate_vit(VisionTransformer& model, const ImageSet& set, int64_t batch_size) {
  NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  const int64_t C = model.config().num_classes;
  QKV_CHECK(set.channels == model.config().channels && set.height == model.config().image_size &&
                set.width == model.config().image_size,
            "evaluate: images are ", set.channels, "x", set.height, "x", set.width, ", the model takes ",
            model.config().channels, "x", model.config().image_size, "x", model.config().image_size);
  VitEvaluation e;
  e.confusion.assign((size_t)(C * C), 0);
  int64_t correct = 0;
  for (int64_t start = 0; start < set.count; start += batch_size) {
    std::vector<int64_t> idx((size_t)std::min(batch_size, set.count - start));
    std::iota(idx.begin(), idx.end(), start);
    Tensor logits = model.forward(image_batch(set, idx));
    const float* l = logits.data<float>();
    for (size_t i = 0; i < idx.size(); ++i) {
      const int64_t predicted = std::max_element(l + i * C, l + (i + 1) * C) - (l + i * C);
      const int64_t truth = set.labels[idx[i]];
      QKV_CHECK(truth >= 0 && truth < C, "evaluate: label ", truth, " of image ", idx[i], " is not one of the ", C,
                " classes");
      e.confusion[truth * C + predicted]++;
      correct += predicted == truth;
    }
  }
  e.images = set.count;
  e.accuracy = set.count ? (double)correct / set.count : 0;
  if (was_training) model.train();
  return e;
}

std::shared_ptr<VisionTransformer> load_vit_model(const std::string& dir, const std::string& command,
                                                  const std::string& dtype) {
  return std::dynamic_pointer_cast<VisionTransformer>(load_model_folder(dir, Task::Classify, command, {dtype}).model);
}

std::vector<int64_t> top_classes(const float* p, int64_t classes, int64_t k) {
  k = std::min(k, classes);
  std::vector<int64_t> order((size_t)classes);
  for (int64_t j = 0; j < classes; ++j) order[(size_t)j] = j;
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int64_t x, int64_t y) { return p[x] > p[y] || (p[x] == p[y] && x < y); });
  order.resize((size_t)k);
  return order;
}

}  // namespace qkv
