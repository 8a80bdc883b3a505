// Writes model/testdata/ggml_quants/<type>.bin: ggml's own reference quantization and
// dequantization (llama.cpp's ggml/src/ggml-quants.c) of fixed inputs, for
// //model:ggml_quants_test to hold model/gguf_quants against, bit for bit. Not built by Bazel:
// it needs llama.cpp's sources (README.md says where they come from and how to run this).
//
// File layout, little-endian: "KVQV", uint32 ggml type id, uint32 n; n float inputs; the
// n / block_elems blocks quantize_row_<type>_ref made of them; n floats dequantize_row_<type>
// gave back from those blocks.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-quants.h"

enum { kN = 4096 };  // 16 chunks of 256 values, each a different regime

static uint64_t state = 0x6b76726d2d717561ull;  // fixed: the same inputs every run
static double Uniform(void) {                   // [0, 1), xorshift64*
  state ^= state >> 12;
  state ^= state << 25;
  state ^= state >> 27;
  return (double)((state * 2685821657736338717ull) >> 11) / 9007199254740992.0;
}
static double Gauss(void) {
  double u = Uniform(), v = Uniform();
  if (u < 1e-300) u = 1e-300;
  return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

static void Inputs(float* x) {
  for (int c = 0; c < kN / 256; ++c) {
    float* y = x + c * 256;
    for (int i = 0; i < 256; ++i) {
      double v = 0;
      switch (c) {
        case 0:
          v = Gauss();
          break;  // unit scale
        case 1:
          v = 1e-3 * Gauss();
          break;  // small
        case 2:
          v = Uniform();
          break;  // all positive
        case 3:
          v = -Uniform();
          break;  // all negative
        case 4:
          v = 0;
          break;  // zeros
        case 5:
          v = 0.37;
          break;  // a constant
        case 6:
          v = Gauss() * (Uniform() < 0.02 ? 50 : 1);
          break;  // outliers
        case 7:
          v = 1e-6 * Gauss();
          break;  // scales below f16's normal range
        case 8:
          v = 100 * Gauss();
          break;  // large
        case 9:
          v = Uniform() < 0.9 ? 0 : Gauss();
          break;  // sparse
        case 10:
          v = (int)(Uniform() * 16) - 8;
          break;  // small integers
        case 11:
          v = ((int)(Uniform() * 32) - 16) * 0.5 + 0.25;
          break;  // near rounding ties
        default:
          v = 0.02 * Gauss();
          break;  // like trained weights
      }
      y[i] = (float)v;
    }
  }
}

typedef void (*QuantizeFn)(const float*, void*, int64_t);
typedef void (*DequantizeFn)(const void*, float*, int64_t);

struct Type {
  const char* name;
  uint32_t id;
  int block_elems, block_bytes;
  QuantizeFn quantize;
  DequantizeFn dequantize;
};

#define T(name, id, elems, block)                                                \
  {                                                                              \
#name, id, elems, (int)sizeof(block), (QuantizeFn)quantize_row_##name##_ref, \
        (DequantizeFn)dequantize_row_##name                                      \
  }

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s OUTPUT_DIR\n", argv[0]);
    return 2;
  }
  const struct Type types[] = {
      T(q4_0, 2, 32, block_q4_0),   T(q4_1, 3, 32, block_q4_1),   T(q5_0, 6, 32, block_q5_0),
      T(q5_1, 7, 32, block_q5_1),   T(q8_0, 8, 32, block_q8_0),   T(q4_K, 12, 256, block_q4_K),
      T(q5_K, 13, 256, block_q5_K), T(q6_K, 14, 256, block_q6_K),   T(mxfp4, 39, 32, block_mxfp4),
  };
  static float x[kN], y[kN];
  static unsigned char blocks[kN * 2];
  Inputs(x);
  for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); ++t) {
    const struct Type* ty = &types[t];
    const size_t bytes = (size_t)kN / ty->block_elems * ty->block_bytes;
    memset(blocks, 0, sizeof(blocks));
    ty->quantize(x, blocks, kN);
    ty->dequantize(blocks, y, kN);
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s.bin", argv[1], ty->name);
    FILE* f = fopen(path, "wb");
    if (f == NULL) {
      perror(path);
      return 1;
    }
    const uint32_t n = kN;
    fwrite("KVQV", 1, 4, f);
    fwrite(&ty->id, 4, 1, f);
    fwrite(&n, 4, 1, f);
    fwrite(x, 4, kN, f);
    fwrite(blocks, 1, bytes, f);
    fwrite(y, 4, kN, f);
    fclose(f);
    printf("%s: %zu block bytes\n", path, bytes);
  }
  return 0;
}
