#!/usr/bin/python3
"""Generates verbs_api/fallback_symbols.cc: a WEAK error-returning definition of every function of our drop-in
libibverbs.so.1's public version nodes, so the library always links (-z defs) and loads, whatever the lead has
implemented so far. A strong definition anywhere in //verbs_api:verbs replaces the weak one at link time.

usage: /usr/bin/python3 tools/gen_fallback_symbols.py [--check]
  (from any directory; --check exits 1 if the checked-in file is stale instead of rewriting it)

Inputs:
  verbs_api/libibverbs.map            the symbols and their nodes (the source of truth);
  /usr/include/infiniband/verbs.h     the prototypes (libibverbs-dev; the generated file includes it, so the
                                      compiler checks that every definition matches its declaration);
  EXTRA_PROTOTYPES below              prototypes verbs.h does not declare (rdma-core's driver.h / marshall.h / sysfs.h).

Covered: every symbol of IBVERBS_1.0 .. IBVERBS_1.14, plus ibv_query_gid_type of IBVERBS_PRIVATE_34 (the lead
implements it; clients import it). The other IBVERBS_PRIVATE_34 symbols have strong stubs in verbs_api/private_stubs.cc.

Error conventions (each from the verb's man page, section RETURN VALUE):
  pointer            -> NULL, errno = EOPNOTSUPP
  int (default)      -> EOPNOTSUPP, errno = EOPNOTSUPP  ("0 on success, or the value of errno on failure")
  int in MINUS_ONE   -> -1, errno = EOPNOTSUPP          ("0 on success, and -1 on error" and friends)
  ssize_t            -> -EOPNOTSUPP                      (ibv_query_gid_table: "negative errno value on error")
  const char *..._str-> "unknown"                       (the *_str helpers never fail)
  enum / __be64      -> 0 (IBV_RATE_MAX "unknown rate", IBV_FORK_DISABLED, GUID 0), errno = EOPNOTSUPP
  void               -> nothing
"""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAP_PATH = os.path.join(ROOT, "verbs_api/libibverbs.map")
OUT_PATH = os.path.join(ROOT, "verbs_api/fallback_symbols.cc")
VERBS_H = "/usr/include/infiniband/verbs.h"

# Of IBVERBS_PRIVATE_34, only these get a weak fallback here (private_stubs.cc defines the rest).
PRIVATE_WITH_FALLBACK = {"ibv_query_gid_type"}

# Functions verbs.h does not declare. Signatures from rdma-core v44 (libibverbs/driver.h, marshall.h, sysfs.h);
# struct types named here that verbs.h lacks are declared incomplete in the generated file.
EXTRA_PROTOTYPES = {
    "ibv_copy_ah_attr_from_kern": ("void", "struct ibv_ah_attr *dst, struct ib_uverbs_ah_attr *src"),
    "ibv_copy_qp_attr_from_kern": ("void", "struct ibv_qp_attr *dst, struct ib_uverbs_qp_attr *src"),
    "ibv_copy_path_rec_from_kern": ("void", "struct ibv_sa_path_rec *dst, struct ib_user_path_rec *src"),
    "ibv_copy_path_rec_to_kern": ("void", "struct ib_user_path_rec *dst, struct ibv_sa_path_rec *src"),
    "ibv_get_sysfs_path": ("const char *", "void"),
    "ibv_read_sysfs_file": ("int", "const char *dir, const char *file, char *buf, size_t size"),
    "ibv_dofork_range": ("int", "void *base, size_t size"),
    "ibv_dontfork_range": ("int", "void *base, size_t size"),
    "ibv_query_gid_type": (
        "int", "struct ibv_context *context, uint8_t port_num, unsigned int index, enum ibv_gid_type_sysfs *type"),
}
EXTRA_DECLARATIONS = """\
// Types of the prototypes verbs.h lacks (rdma-core's kern-abi / sa-kern-abi / driver.h); only pointers are passed.
struct ib_uverbs_ah_attr;
struct ib_uverbs_qp_attr;
struct ibv_sa_path_rec;
struct ib_user_path_rec;
enum ibv_gid_type_sysfs : int { IBV_GID_TYPE_SYSFS_IB_ROCE_V1, IBV_GID_TYPE_SYSFS_ROCE_V2 };
"""

# int-returning verbs whose failure value is -1 (man pages: ibv_get_cq_event, ibv_get_async_event, ibv_query_gid,
# ibv_query_pkey, ibv_get_pkey_index, ibv_init_ah_from_wc, ibv_get_device_index, ibv_rereg_mr
# (IBV_REREG_MR_ERR_INPUT), ibv_rate_to_mult / ibv_rate_to_mbps (unknown rate), rdma-core's ibv_read_sysfs_file,
# and ibv_query_gid_type (driver.h: -1 with errno)).
MINUS_ONE = {
    "ibv_get_cq_event", "ibv_get_async_event", "ibv_query_gid", "ibv_query_pkey", "ibv_get_pkey_index",
    "ibv_init_ah_from_wc", "ibv_get_device_index", "ibv_rereg_mr", "ibv_rate_to_mult", "ibv_rate_to_mbps",
    "ibv_read_sysfs_file", "ibv_query_gid_type",
}
# int-returning functions whose 0 is the honest "no" rather than an error.
ZERO = {"ibv_query_qp_data_in_order"}  # "Returns 1 if the data is guaranteed to be written in-order, 0 otherwise."

# verbs.h defines function-like macros over these exported names; the generated file #undefs them.
MACROS_OVER_EXPORTS = ["ibv_get_device_list", "ibv_query_port", "ibv_reg_mr", "ibv_reg_mr_iova"]


def read_map(path):
    """Returns [(node, symbol)] in file order from a GNU ld version script."""
    text = re.sub(r"/\*.*?\*/", "", open(path).read(), flags=re.S)
    out = []
    for m in re.finditer(r"([A-Za-z0-9_.]+)\s*\{(.*?)\}", text, flags=re.S):
        node, body = m.group(1), m.group(2)
        for line in body.split(";"):
            line = line.strip()
            for prefix in ("global:", "local:"):
                if line.startswith(prefix):
                    line = line[len(prefix):].strip()
            if line and line != "*" and not line.startswith("local"):
                out.append((node, line))
    return out


def header_declarations(path):
    """Yields the top-level non-static declarations of a C header, one string each, comments and preprocessor
    lines removed."""
    text = open(path).read()
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    text = re.sub(r"\\\n", " ", text)
    text = "\n".join(l for l in text.split("\n") if not l.lstrip().startswith("#"))
    text = text.replace('extern "C" {', " ")
    depth, cur = 0, []
    for ch in text:
        if ch == "{":
            depth += 1
        elif ch == "}":
            if depth > 0:
                depth -= 1
                if depth == 0:
                    cur = []  # a struct/enum/union/function body ended; a function definition ends here
            continue
        elif depth == 0:
            if ch == ";":
                decl = " ".join("".join(cur).split())
                cur = []
                if decl and not decl.startswith(("static", "typedef")):
                    yield decl
            else:
                cur.append(ch)


def clean_type(t):
    t = re.sub(r"__attribute__\s*\(\(.*?\)\)", " ", t)
    t = t.replace("__attribute_const", " ").replace("extern", " ")
    return " ".join(t.split())


def prototypes(names):
    found = {}
    for decl in header_declarations(VERBS_H):
        for name in names:
            m = re.match(r"^(.*?[\s*])" + re.escape(name) + r"\s*\((.*)\)\s*(__attribute__.*)?$", decl)
            if m and "(" not in m.group(1):
                found[name] = (clean_type(m.group(1)), m.group(2).strip())
    for name in names:
        if name in EXTRA_PROTOTYPES:
            if name in found:
                sys.exit(f"{name}: declared by verbs.h now, remove it from EXTRA_PROTOTYPES")
            found[name] = EXTRA_PROTOTYPES[name]
    missing = [n for n in names if n not in found]
    if missing:
        sys.exit(f"no prototype for {missing}: add them to EXTRA_PROTOTYPES")
    return found


def body(name, ret):
    r = ret.replace(" ", "")
    if r == "void":
        return ""
    if r.endswith("*"):
        if r == "constchar*" and name.endswith("_str"):
            return '  return "unknown";\n'
        return "  errno = EOPNOTSUPP;\n  return nullptr;\n"
    if r == "int":
        if name in ZERO:
            return "  return 0;\n"
        if name in MINUS_ONE:
            return "  errno = EOPNOTSUPP;\n  return -1;\n"
        return "  errno = EOPNOTSUPP;\n  return EOPNOTSUPP;\n"
    if r == "ssize_t":
        return "  errno = EOPNOTSUPP;\n  return -EOPNOTSUPP;\n"
    if r.startswith("enum") or r == "__be64":
        return f"  errno = EOPNOTSUPP;\n  return static_cast<{ret}>(0);\n"
    sys.exit(f"{name}: no error convention for return type '{ret}'")


def generate():
    # UROCE_PRIVATE_* nodes are uroce's own interfaces between its libraries (verbs_api/cm_export.h): defined
    # strongly, never by a fallback.
    entries = [(node, s) for node, s in read_map(MAP_PATH)
               if not node.startswith("UROCE_PRIVATE")
               and (node != "IBVERBS_PRIVATE_34" or s in PRIVATE_WITH_FALLBACK)]
    protos = prototypes([s for _, s in entries])
    out = [
        "// GENERATED by tools/gen_fallback_symbols.py from verbs_api/libibverbs.map - do not edit; rerun it.",
        "//",
        "// A weak, error-returning definition of each public libibverbs function, so libibverbs.so.1 links with",
        "// -z defs and every client loads even before a verb is implemented. A strong definition in //verbs_api:verbs",
        "// wins at link time. Error values follow each verb's man page (see the generator's docstring).",
        "// Covers %d symbols:" % len(entries),
    ]
    for node, s in entries:
        out.append(f"//   {node:<18} {s}")
    out += [
        "",
        "#include <errno.h>",
        "#include <stddef.h>",
        "#include <stdint.h>",
        "#include <sys/types.h>",
        "",
        "#include <infiniband/verbs.h>",
        "",
    ]
    for m in MACROS_OVER_EXPORTS:
        out.append(f"#undef {m}")
    out += ["", EXTRA_DECLARATIONS, 'extern "C" {', ""]
    node = None
    for n, s in entries:
        if n != node:
            out.append(f"// ---- {n} ----")
            node = n
        ret, params = protos[s]
        sep = "" if ret.endswith("*") else " "
        out.append(f"__attribute__((weak)) {ret}{sep}{s}({params}) {{")
        if body(s, ret):
            out.append(body(s, ret).rstrip("\n"))
        out.append("}")
        out.append("")
    out += ['}  // extern "C"', ""]
    return "\n".join(out)


def main():
    text = generate()
    if "--check" in sys.argv[1:]:
        current = open(OUT_PATH).read() if os.path.exists(OUT_PATH) else ""
        if current != text:
            print("verbs_api/fallback_symbols.cc is stale: run /usr/bin/python3 tools/gen_fallback_symbols.py",
                  file=sys.stderr)
            return 1
        return 0
    with open(OUT_PATH, "w") as f:
        f.write(text)
    print(f"wrote {os.path.relpath(OUT_PATH)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
