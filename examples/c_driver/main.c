/* One training step of an nfc model from C.
 *
 *   nfc compile model.nf -o model.so
 *   nfc compile model.so --emit=header -o model.h
 *   cc -O2 -I. main.c -o driver ./model.so -Wl,-rpath,'$ORIGIN'
 *   ./driver inputs.bin out.bin [seed]
 *
 * inputs.bin holds the raw bytes of train_step's inputs (role 'i'), in argument order;
 * out.bin receives the step's outputs, then every persistent tensor after the step (the
 * nfc_init table order). The parameters start from nfc_init(seed), the rng argument (if the
 * model has one) is (seed, 0). Prints the loss when the first output is a scalar f32.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model.h"

static void *alloc(int64_t bytes) {
  void *p = aligned_alloc(64, (size_t)((bytes + 63) / 64 * 64 + 64));
  if (!p) {
    fprintf(stderr, "driver: out of memory\n");
    exit(1);
  }
  return p;
}

int main(int argc, char **argv) {
  /* libgomp, which the model links, reads its wait policy once, before main: unless the user
   * chose one, run again with idle threads that sleep rather than spin at every barrier
   * (spinning threads take the cores a loaded machine needs; docs/runtime.md). */
  if (!getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT")) {
    setenv("OMP_WAIT_POLICY", "passive", 1);
    execv("/proc/self/exe", argv); /* returns only on failure: go on as we are */
  }
  if (argc < 3) {
    fprintf(stderr, "usage: %s inputs.bin out.bin [seed]\n", argv[0]);
    return 2;
  }
  if (nfc_abi_version() != NFC_ABI_VERSION) {
    fprintf(stderr, "driver: library ABI %d, header ABI %d\n", nfc_abi_version(),
            NFC_ABI_VERSION);
    return 1;
  }
  int64_t seed = argc > 3 ? atoll(argv[3]) : 0;

  void *tensors[NFC_N_TENSORS + 1];
  for (int i = 0; i < NFC_N_TENSORS; i++) tensors[i] = alloc(nfc_tensor_bytes[i]);
  nfc_init(tensors, seed);

  FILE *in = fopen(argv[1], "rb");
  if (!in) {
    perror(argv[1]);
    return 1;
  }
  void *args[NFC_TRAIN_STEP_N_ARGS + 1];
  int64_t rng[2] = {seed, 0};
  for (int i = 0; i < NFC_TRAIN_STEP_N_ARGS; i++) {
    char role = nfc_train_step_arg_role[i];
    if (role == 'i') {
      args[i] = alloc(nfc_train_step_arg_bytes[i]);
      if (fread(args[i], 1, (size_t)nfc_train_step_arg_bytes[i], in) !=
          (size_t)nfc_train_step_arg_bytes[i]) {
        fprintf(stderr, "driver: %s is too short for input '%s'\n", argv[1],
                nfc_train_step_arg_names[i]);
        return 1;
      }
    } else if (role == 'r') {
      args[i] = rng;
    } else {
      args[i] = tensors[nfc_train_step_arg_tensor[i]];
    }
  }
  fclose(in);

  void *outs[NFC_TRAIN_STEP_N_OUTS + 1];
  for (int j = 0; j < NFC_TRAIN_STEP_N_OUTS; j++) outs[j] = alloc(nfc_train_step_out_bytes[j]);
  void *arena = alloc(nfc_train_step_arena_bytes());

  nfc_train_step(args, outs, arena); /* the whole step: one call */

  if (NFC_TRAIN_STEP_N_OUTS > 0 && nfc_train_step_out_bytes[0] == 4)
    printf("%s = %.6f\n", nfc_train_step_out_names[0], *(float *)outs[0]);
  FILE *out = fopen(argv[2], "wb");
  if (!out) {
    perror(argv[2]);
    return 1;
  }
  for (int j = 0; j < NFC_TRAIN_STEP_N_OUTS; j++)
    fwrite(outs[j], 1, (size_t)nfc_train_step_out_bytes[j], out);
  for (int i = 0; i < NFC_N_TENSORS; i++) fwrite(tensors[i], 1, (size_t)nfc_tensor_bytes[i], out);
  fclose(out);
  return 0;
}
