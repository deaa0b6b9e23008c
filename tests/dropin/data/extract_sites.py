"""How ``consumer_names.json`` was made (issue 40), kept for the next consumer release; not run by the tests.

1. ``pip download --no-deps vllm==0.33.0 sglang==0.5.23 sgl-deep-gemm==0.2.3.post2`` and unzip the wheels.
2. ``python extract_sites.py <unzipped>/sglang > sglang.json`` (and the same for ``vllm``): every name read from the
   module ``deep_gemm`` outside tests and benchmarks — ``from deep_gemm[.x] import y``, attribute reads on a name
   bound to ``deep_gemm`` (``import deep_gemm``, ``_import_deep_gemm()``, ``_get_deep_gemm()``), and
   ``getattr`` / ``hasattr`` of a literal name on it — with ``file:line``. For vLLM, add the call sites of
   ``vllm/utils/deep_gemm.py``'s wrappers (its ``_lazy_init`` binds each name with ``getattr``).
3. By hand, per name: read the gate around each site and classify it (``sm90`` and ``why`` in the JSON).
"""
import ast, pathlib, sys, collections, json
root = pathlib.Path(sys.argv[1]); extra_mod_exprs = set(sys.argv[2:])
out = collections.defaultdict(list)
for p in sorted(root.rglob("*.py")):
    rel = str(p.relative_to(root.parent))
    if "third_party/deep_gemm" in rel or "/test" in rel or "benchmark" in rel: continue
    s = p.read_text(errors="ignore")
    if "deep_gemm" not in s: continue
    try: t = ast.parse(s)
    except Exception: continue
    bound = {}
    for par in ast.walk(t):
        for ch in ast.iter_child_nodes(par): ch._parent = par
    for node in ast.walk(t):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "deep_gemm" or a.name.startswith("deep_gemm."):
                    if a.asname: bound[a.asname] = a.name
                    else: bound["deep_gemm"] = "deep_gemm"
        if isinstance(node, ast.ImportFrom) and node.module and (node.module == "deep_gemm" or node.module.startswith("deep_gemm.")):
            sub = node.module[len("deep_gemm"):].lstrip(".")
            for a in node.names:
                out[(sub + "." if sub else "") + a.name].append(f"{rel}:{node.lineno}")
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name) and node.value.func.id in {"_import_deep_gemm", "_get_deep_gemm"} | extra_mod_exprs:
            for tg in node.targets:
                if isinstance(tg, ast.Name): bound[tg.id] = "deep_gemm"
                if isinstance(tg, ast.Attribute): bound["self." + tg.attr] = "deep_gemm"
    def chain(n):
        parts = []
        while isinstance(n, ast.Attribute): parts.append(n.attr); n = n.value
        if isinstance(n, ast.Name): parts.append(n.id); return list(reversed(parts))
        return None
    for node in ast.walk(t):
        if isinstance(node, ast.Attribute) and not isinstance(getattr(node, "_parent", None), ast.Attribute):
            c = chain(node)
            if not c: continue
            for k in (c[0], ".".join(c[:2])):
                if k in bound:
                    rest = c[len(k.split(".")):]
                    if rest:
                        if rest[0] in ("utils", "testing") and len(rest) > 1 and rest[1] in ("layout", "math"):
                            name = ".".join(rest[:3])
                        elif rest[0] in ("utils", "testing") and len(rest) > 1:
                            name = ".".join(rest[:2])
                        else:
                            name = rest[0]
                        out[name].append(f"{rel}:{node.lineno}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr") and len(node.args) >= 2:
            c = chain(node.args[0]) if not isinstance(node.args[0], ast.Name) else [node.args[0].id]
            if c and (".".join(c) in bound) and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
                out[node.args[1].value].append(f"{rel}:{node.lineno}")
json.dump({k: sorted(set(v)) for k, v in sorted(out.items())}, sys.stdout, indent=0)
