# RUN: nfc opt %s -p 'training-functions,data-parallel{bn=sync}' --no-locs | filecheck %s
# RUN: nfc opt %s -p 'training-functions,data-parallel' --no-locs | filecheck %s --check-prefix=LOCAL
# data-parallel{bn=sync}: synchronised batch norm. The per-channel sums over the batch of
# batch_norm1d_train (the mean's, then the squared deviations') are all-reduced in the forward
# of @train_step before they are used; the backward reduces their adjoints the same way.
import std.nn

model bn(batch = 4) {
  input  x: f32[batch, 8]
  input  y: i32[batch]
  param  w1: f32[8, 6] = he_normal
  param  g: f32[6] = ones
  param  b: f32[6] = zeros
  param  w2: f32[6, 3] = glorot_uniform
  h, m, v = batch_norm1d_train(matmul(x, w1), g, b)
  logits = matmul(relu(h), w2)
  loss = softmax_cross_entropy(logits, y)
  output logits
  minimize loss with sgd(lr = 0.1)
}

# CHECK:       nf.module @bn attributes {{{.*}}nf.data_parallel = {buckets = 1, compress = "none", bn = "sync", batch_stats = 2}}
# CHECK-LABEL: nf.func @forward
# CHECK-NOT:   nf.allreduce
# CHECK-LABEL: nf.func @train_step
# CHECK:       %[[S:[0-9]+]] = nf.compute [c: 6] sum [n: 4] (%y_{{[0-9]+}}[n, c])
# CHECK-NEXT:  %[[SA:[a-z0-9_]+]] = nf.allreduce %[[S]] {nf.bucket = 1, nf.compress = "none", nf.reduce = "mean", nf.collective = "batch-stats"} : tensor<6xf32>
# CHECK-NEXT:  %mean = nf.compute [c: 6] (%[[SA]][c] / 4.0)
# CHECK:       %[[Q:[0-9]+]] = nf.compute [c: 6] sum [n: 4] (%xc[n, c] * %xc[n, c])
# CHECK-NEXT:  %[[QA:[a-z0-9_]+]] = nf.allreduce %[[Q]] {nf.bucket = 2, {{.*}}nf.collective = "batch-stats"} : tensor<6xf32>
# CHECK-NEXT:  %var = nf.compute [c: 6] (%[[QA]][c] / 4.0)
# CHECK:       nf.allreduce %d_{{[a-z0-9_]+}} {nf.bucket = 3, {{.*}}nf.collective = "batch-stats-grad", nf.phase = "backward"}
# CHECK:       nf.allreduce %d_{{[a-z0-9_]+}} {nf.bucket = 4, {{.*}}nf.collective = "batch-stats-grad", nf.phase = "backward"}
# CHECK:       nf.allreduce %d_{{.*}} {nf.bucket = 0, {{.*}}nf.collective = "gradients"}
# CHECK-LABEL: nf.func @eval
# CHECK-NOT:   nf.allreduce

# bn=local (the default): the statistics stay per rank, only the gradients are reduced
# LOCAL-LABEL: nf.func @train_step
# LOCAL:       nf.allreduce {{.*}}nf.collective = "gradients"
# LOCAL-NOT:   nf.allreduce
