"""Validates the Kubernetes objects Factory builds for a tenant, as a strict
API server would, without an API server.

Stands in for the API server's admission of these kinds (run under Debian's
/usr/bin/python3, which has python3-jsonschema, python3-yaml and
python3-kubernetes):

- kubevirt.io/v1 VirtualMachine: against `v1.VirtualMachine` in the real
  KubeVirt OpenAPI document (shared/schemas/kubevirt-openapi.json), every
  #/definitions reference resolved, and unknown fields rejected everywhere
  (additionalProperties: false on every object definition that is not
  free-form), as a server with strict field validation does.
- core v1 Namespace, Secret, Service: against the field lists and types of
  python3-kubernetes' generated models (the client's copy of the core
  OpenAPI), unknown fields rejected, required fields enforced by the models.
- metadata names and labels: the API server's name rules (DNS-1123 label or
  subdomain, DNS-1035 label for Services) and label syntax.

It is a fallback until tests/fakes/k8s_schema.py (the fake API server's
validator) exists; both take the same command line:

  /usr/bin/python3 validate_kubevirt.py validate FILE...

FILE holds one or more YAML (or JSON) documents. Prints one line per
document and exits 1 if any is invalid.
"""
import copy
import json
import os
import re
import sys

import jsonschema
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
SCHEMAS = os.environ.get(
    "FACTORY_SCHEMAS_DIR",
    os.path.normpath(os.path.join(HERE, "..", "..", "..", "shared", "schemas")))

# Definitions whose content is arbitrary by design; every other object
# definition is closed.
FREE_FORM = {
    "k8s.io.apimachinery.pkg.apis.meta.v1.FieldsV1",
    "k8s.io.apimachinery.pkg.apis.meta.v1.Patch",
    "k8s.io.apimachinery.pkg.runtime.RawExtension",
}

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")


class Invalid(Exception):
    pass


_kubevirt_validator = None


def kubevirt_validator():
    global _kubevirt_validator
    if _kubevirt_validator is None:
        path = os.path.join(SCHEMAS, "kubevirt-openapi.json")
        with open(path) as f:
            doc = json.load(f)
        definitions = copy.deepcopy(doc["definitions"])
        for name, d in definitions.items():
            if name in FREE_FORM:
                continue
            if d.get("type") == "object" and "additionalProperties" not in d:
                d["additionalProperties"] = False
        schema = {"definitions": definitions, "$ref": "#/definitions/v1.VirtualMachine"}
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft4Validator)
        _kubevirt_validator = cls(schema)
    return _kubevirt_validator


def check_virtual_machine(obj):
    errors = sorted(kubevirt_validator().iter_errors(obj), key=lambda e: list(e.absolute_path))
    if errors:
        lines = []
        for e in errors[:10]:
            where = ".".join(str(p) for p in e.absolute_path) or "(top)"
            lines.append(f"{where}: {e.message}")
        raise Invalid("not a valid v1.VirtualMachine: " + "; ".join(lines))


def _model_check(data, type_name, path):
    """Walks `data` against a python3-kubernetes model type, rejecting unknown
    fields and wrong JSON types."""
    import kubernetes.client as kc

    if type_name == "str":
        if not isinstance(data, str):
            raise Invalid(f"{path}: want a string, got {json.dumps(data)}")
        return
    if type_name == "int":
        if not isinstance(data, int) or isinstance(data, bool):
            raise Invalid(f"{path}: want an integer, got {json.dumps(data)}")
        return
    if type_name == "bool":
        if not isinstance(data, bool):
            raise Invalid(f"{path}: want a boolean, got {json.dumps(data)}")
        return
    if type_name == "object":  # IntOrString and friends
        if not isinstance(data, (str, int)) or isinstance(data, bool):
            raise Invalid(f"{path}: want an integer or a string, got {json.dumps(data)}")
        return
    if type_name == "datetime":
        if not isinstance(data, str):
            raise Invalid(f"{path}: want an RFC 3339 time string")
        return
    m = re.match(r"^list\[(.*)\]$", type_name)
    if m:
        if not isinstance(data, list):
            raise Invalid(f"{path}: want a list")
        for i, item in enumerate(data):
            _model_check(item, m.group(1), f"{path}[{i}]")
        return
    m = re.match(r"^dict\((\w+), (.*)\)$", type_name)
    if m:
        if not isinstance(data, dict):
            raise Invalid(f"{path}: want a map")
        for k, v in data.items():
            _model_check(v, m.group(2), f"{path}.{k}")
        return
    model = getattr(kc, type_name, None)
    if model is None:
        raise Invalid(f"{path}: validator does not know type {type_name}")
    if not isinstance(data, dict):
        raise Invalid(f"{path}: want an object ({type_name})")
    by_json = {json_name: attr for attr, json_name in model.attribute_map.items()}
    for k, v in data.items():
        if k not in by_json:
            raise Invalid(f"{path}: unknown field \"{k}\" in {type_name}")
        _model_check(v, model.openapi_types[by_json[k]], f"{path}.{k}")


def check_core(obj, type_name):
    import kubernetes.client as kc

    _model_check(obj, type_name, obj.get("kind", "object"))
    # The generated models enforce required fields (client-side validation)
    # when built from data; the ApiClient's deserializer builds them.
    client = kc.ApiClient()
    try:
        client._ApiClient__deserialize(obj, type_name)
    except (ValueError, TypeError) as e:
        raise Invalid(f"{type_name}: {e}")


def check_labels(labels, where):
    for k, v in (labels or {}).items():
        prefix, _, name = k.rpartition("/")
        if (prefix and (len(prefix) > 253 or not DNS1123_SUBDOMAIN.match(prefix))) or \
                len(name) > 63 or not QUALIFIED_NAME.match(name):
            raise Invalid(f"{where}: invalid label key {k!r}")
        if not isinstance(v, str) or len(v) > 63 or (v and not QUALIFIED_NAME.match(v)):
            raise Invalid(f"{where}: invalid value {v!r} for label {k!r}")


def check_name(obj, rule):
    meta = obj.get("metadata") or {}
    name = meta.get("name", "")
    ok = {
        "label": lambda n: len(n) <= 63 and DNS1123_LABEL.match(n),
        "dns1035": lambda n: len(n) <= 63 and DNS1035_LABEL.match(n),
        "subdomain": lambda n: len(n) <= 253 and DNS1123_SUBDOMAIN.match(n),
    }[rule](name)
    if not ok:
        raise Invalid(f"metadata.name {name!r} is not a valid {rule} name")
    ns = meta.get("namespace")
    if ns is not None and not (len(ns) <= 63 and DNS1123_LABEL.match(ns)):
        raise Invalid(f"metadata.namespace {ns!r} is not a DNS-1123 label")
    check_labels(meta.get("labels"), "metadata.labels")


KINDS = {
    ("kubevirt.io/v1", "VirtualMachine"): ("subdomain", check_virtual_machine),
    ("v1", "Namespace"): ("label", lambda o: check_core(o, "V1Namespace")),
    ("v1", "Secret"): ("subdomain", lambda o: check_core(o, "V1Secret")),
    ("v1", "Service"): ("dns1035", lambda o: check_core(o, "V1Service")),
}


def validate_object(obj):
    if not isinstance(obj, dict):
        raise Invalid("not an object")
    key = (obj.get("apiVersion"), obj.get("kind"))
    if key not in KINDS:
        raise Invalid(f"validator does not know apiVersion {key[0]!r} kind {key[1]!r}")
    rule, check = KINDS[key]
    check_name(obj, rule)
    check(obj)


def validate_file(path):
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d is not None]
    if not docs:
        print(f"{path}: no documents")
        return False
    ok = True
    for i, obj in enumerate(docs, 1):
        what = f"{path}: document {i}"
        if isinstance(obj, dict):
            what += f" ({obj.get('kind')} {(obj.get('metadata') or {}).get('name')})"
        try:
            validate_object(obj)
            print(f"{what}: valid")
        except Invalid as e:
            ok = False
            print(f"{what}: INVALID: {e}")
    return ok


def main(argv):
    if len(argv) < 3 or argv[1] != "validate":
        print("usage: validate_kubevirt.py validate FILE...", file=sys.stderr)
        return 2
    results = [validate_file(p) for p in argv[2:]]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
