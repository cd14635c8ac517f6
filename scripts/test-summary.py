"""Reads meson's testlog.json files and prints one closing line
`N passed, N failed, N skipped`, counting cmocka test cases individually
(a cmocka binary is one meson test but reports each case) and every other
meson test as one."""
import json
import re
import sys

passed = failed = skipped = 0
for path in sys.argv[1:]:
    try:
        lines = open(path).read().splitlines()
    except OSError:
        continue
    for line in lines:
        t = json.loads(line)
        out = (t.get("stdout") or "") + (t.get("stderr") or "")
        res = t["result"]
        m_ok = re.search(r"\[  PASSED  \] (\d+) test", out)
        m_bad = re.search(r"\[  FAILED  \] (\d+) test", out)
        if res == "SKIP":
            skipped += 1
        elif m_ok or m_bad:
            p = int(m_ok.group(1)) if m_ok else 0
            f = int(m_bad.group(1)) if m_bad else 0
            if res != "OK" and f == 0:
                f = 1  # crashed or timed out after the summary
            passed += p
            failed += f
        elif res in ("OK", "EXPECTEDFAIL"):
            passed += 1
        else:
            failed += 1
print(f"{passed} passed, {failed} failed, {skipped} skipped")
sys.exit(1 if failed else 0)
