// meridian-knobs: lists every MERIDIAN_* knob; --markdown prints the README table.
#include <cstdio>

#include <CLI/CLI.hpp>

#include "core/knobs.h"

int main(int argc, char** argv) {
  CLI::App app{"Lists Meridian's environment knobs"};
  bool markdown = false;
  app.add_flag("--markdown", markdown, "Print the README table");
  CLI11_PARSE(app, argc, argv);
  if (markdown) {
    std::fputs(meridian::knobMarkdownTable().c_str(), stdout);
    return 0;
  }
  for (const auto& k : meridian::allKnobs()) {
    std::printf("%-32s %-8s default=%-12s %s\n", k.name, meridian::knobTypeName(k).c_str(), k.defaultValue, k.doc);
  }
  return 0;
}
