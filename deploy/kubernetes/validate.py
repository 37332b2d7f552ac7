#!/usr/bin/env python3
"""Validates deploy/kubernetes offline against the Kubernetes schemas.

kubernetes-validate (PyPI) carries the schemas of every Kubernetes version
it knows, so nothing is fetched. Checked, strictly (unknown fields are
errors): every resource the kustomization lists, the ConfigMap its
generator makes, and the DaemonSet with each component's JSON 6902 patch
applied. Also: every file the kustomization names exists, and nothing in
the directory is left out of it.

    python3 deploy/kubernetes/validate.py [--kubernetes-version 1.33.0] [DIR]

Exit status 0 when everything is valid, 1 with one line per problem.
"""

import argparse
import copy
import json
import os
import sys

import kubernetes_validate
import yaml


def load_all(path):
    with open(path) as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def pointer_parts(pointer):
    return [p.replace("~1", "/").replace("~0", "~") for p in pointer.lstrip("/").split("/")]


def apply_json6902(doc, ops):
    """The subset of RFC 6902 kustomize patches use here: add, replace, remove."""
    doc = copy.deepcopy(doc)
    for op in ops:
        *parents, last = pointer_parts(op["path"])
        node = doc
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        if op["op"] in ("add", "replace"):
            if isinstance(node, list):
                index = len(node) if last == "-" else int(last)
                if op["op"] == "add":
                    node.insert(index, op["value"])
                else:
                    node[index] = op["value"]
            else:
                if op["op"] == "replace" and last not in node:
                    raise ValueError(f"replace of missing {op['path']}")
                node[last] = op["value"]
        elif op["op"] == "remove":
            del node[int(last) if isinstance(node, list) else last]
        else:
            raise ValueError(f"unsupported op {op['op']}")
    return doc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir", nargs="?", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--kubernetes-version", default="1.33.0")
    args = ap.parse_args()
    base = args.dir
    problems = []
    checked = []

    def validate(what, resource):
        try:
            kubernetes_validate.validate(resource, args.kubernetes_version, strict=True)
            checked.append(what)
        except kubernetes_validate.ValidationError as e:
            problems.append(f"{what}: {e.path}: {e.message}")
        except Exception as e:  # unknown kind or version
            problems.append(f"{what}: {e}")

    kustomization = load_all(os.path.join(base, "kustomization.yaml"))[0]
    named = {"kustomization.yaml", os.path.basename(__file__)}
    resources = {}
    for name in kustomization.get("resources", []):
        path = os.path.join(base, name)
        named.add(name)
        if not os.path.isfile(path):
            problems.append(f"kustomization.yaml: resource {name} does not exist")
            continue
        for doc in load_all(path):
            resources[(doc.get("kind"), doc["metadata"]["name"])] = doc
            validate(f"{name} ({doc.get('kind')} {doc['metadata']['name']})", doc)
    for gen in kustomization.get("configMapGenerator", []):
        data = {}
        for name in gen.get("files", []):
            named.add(name)
            path = os.path.join(base, name)
            if not os.path.isfile(path):
                problems.append(f"kustomization.yaml: configMapGenerator file {name} does not exist")
                continue
            with open(path) as f:
                data[os.path.basename(name)] = f.read()
        cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": gen["name"]}, "data": data}
        validate(f"configMapGenerator {gen['name']}", cm)
    # Components: every subdirectory with a kustomization of kind Component.
    for entry in sorted(os.listdir(base)):
        comp_dir = os.path.join(base, entry)
        comp_file = os.path.join(comp_dir, "kustomization.yaml")
        if not os.path.isfile(comp_file):
            continue
        named.add(entry)
        comp = load_all(comp_file)[0]
        if comp.get("kind") != "Component":
            problems.append(f"{entry}/kustomization.yaml: expected kind Component")
            continue
        with open(os.path.join(base, "kustomization.yaml")) as f:
            if entry not in f.read():
                problems.append(f"kustomization.yaml does not mention the component {entry}")
        for patch in comp.get("patches", []):
            target = resources.get((patch["target"]["kind"], patch["target"]["name"]))
            if target is None:
                problems.append(f"{entry}: patch target {patch['target']} is not a base resource")
                continue
            ops = load_all(os.path.join(comp_dir, patch["path"]))[0]
            try:
                patched = apply_json6902(target, ops)
            except (KeyError, IndexError, ValueError) as e:
                problems.append(f"{entry}/{patch['path']}: does not apply: {e}")
                continue
            validate(f"{entry}: {patch['target']['kind']} {patch['target']['name']} patched", patched)
            spec = patched["spec"]["template"]["spec"]
            unmasked = any(
                c.get("securityContext", {}).get("procMount") == "Unmasked" for c in spec["containers"]
            )
            # The API server's own rule (not in the schema): Unmasked needs
            # a pod user namespace.
            if unmasked and spec.get("hostUsers") is not False:
                problems.append(f"{entry}: procMount Unmasked without hostUsers: false is refused by the API server")
    for entry in sorted(os.listdir(base)):
        if entry not in named and not entry.startswith("."):
            problems.append(f"{entry} is in {base} but not in kustomization.yaml")

    for p in problems:
        print(f"FAIL {p}")
    for c in checked:
        print(f"ok   {c}")
    print(json.dumps({"checked": len(checked), "problems": len(problems)}))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
