#!/usr/bin/env python3
"""Tests of include_graph.py on small planted trees: the layers come from the
CMakeLists.txt beside src/, and --check fails on each kind of violation,
"../" includes included. Run by the ctest `arch_include_graph_selftest`."""

import contextlib
import io
import os
import shutil
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import include_graph  # noqa: E402

CMAKE = """\
function(monarch_layer layer)  # Not a layer: the definition.
endfunction()
# monarch_layer(commented DEPS low)
monarch_layer(low SOURCES src/low/a.cc)
monarch_layer(mid DEPS low LIBS ${CMAKE_DL_LIBS} SOURCES
  src/mid/b.cc)
monarch_layer(side DEPS low SOURCES src/side/c.cc)
monarch_layer(top TARGET monarch DEPS mid side SOURCES
  $<TARGET_OBJECTS:x>
  src/top/d.cc)
"""


class IncludeGraphTest(unittest.TestCase):
    def tree(self, files):
        """A tree with the CMakeLists.txt above and `files` {path: text}; returns src/."""
        root = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, root)
        with open(os.path.join(root, "CMakeLists.txt"), "w") as f:
            f.write(CMAKE)
        base = {"src/low/a.h": "", "src/mid/b.h": '#include "low/a.h"\n',
                "src/side/c.h": '#include "low/a.h"\n',
                "src/top/d.cc": '#include "mid/b.h"\n#include "side/c.h"\n#include "d.h"\n',
                "src/top/d.h": ""}
        base.update(files)
        for path, text in base.items():
            os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
            with open(os.path.join(root, path), "w") as f:
                f.write(text)
        return os.path.join(root, "src")

    def check(self, src):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = include_graph.main(["--check", "--src", src])
        return code, out.getvalue()

    def test_layers_come_from_cmake(self):
        layers = include_graph.read_layers(os.path.join(os.path.dirname(self.tree({})),
                                                        "CMakeLists.txt"))
        self.assertEqual(layers, [("low", []), ("mid", ["low"]), ("side", ["low"]),
                                  ("top", ["mid", "side"])])

    def test_clean_tree_passes(self):
        code, out = self.check(self.tree({}))
        self.assertEqual(code, 0, out)
        self.assertIn("low < mid < side < top", out)

    def test_up_include_through_dot_dot_fails(self):
        code, out = self.check(self.tree({"src/low/a.cc": '#include "../top/d.h"\n'}))
        self.assertEqual(code, 1, out)
        self.assertIn("low        -> top        (1)  UP", out)
        self.assertIn("low/a.cc:1", out)

    def test_include_of_a_layer_not_in_deps_fails(self):
        code, out = self.check(self.tree({"src/side/c.cc": '#include "mid/b.h"\n'}))
        self.assertEqual(code, 1, out)
        self.assertIn("HIDDEN", out)
        code, out = self.check(self.tree({"src/side/c.cc": '#include "../mid/b.h"\n'}))
        self.assertEqual(code, 1, out)

    def test_folder_that_is_not_a_layer_fails(self):
        code, out = self.check(self.tree({"src/extra/e.h": ""}))
        self.assertEqual(code, 1, out)
        self.assertIn("folders that are not layers: extra", out)


if __name__ == "__main__":
    unittest.main()
