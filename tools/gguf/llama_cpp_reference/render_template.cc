// Renders a chat template with llama.cpp's own Jinja engine (common/jinja), for comparison with
// kvrm's: argv[1] the template, argv[2] a JSON object of the template's variables; prints the
// text, or "ERROR: " and the message. The time strftime_now sees is fixed (2026-12-05, UTC).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "jinja/lexer.h"
#include "jinja/parser.h"
#include "jinja/runtime.h"
#include "json.h"

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  std::ifstream tf(argv[1]), cf(argv[2]);
  std::stringstream ts, cs;
  ts << tf.rdbuf();
  cs << cf.rdbuf();
  const std::string tmpl = ts.str();
  try {
    jinja::lexer lexer;
    auto tokens = lexer.tokenize(tmpl);
    jinja::program prog = jinja::parse_from_tokens(tokens);
    jinja::context ctx(tmpl);
    ctx.current_time = 1796428800;  // 2026-12-05 00:00:00 UTC
    jinja::global_from_json(ctx, common_json::parse(cs.str()), false);
    jinja::runtime runtime(ctx);
    std::cout << runtime.gather_string_parts(runtime.execute(prog))->as_string().str();
  } catch (const std::exception& e) {
    std::cout << "ERROR: " << e.what();
  }
  return 0;
}
