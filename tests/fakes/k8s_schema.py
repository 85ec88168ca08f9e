"""Validates Kubernetes objects the way a strict API server would, from real
schemas, without an API server. Run under Debian's /usr/bin/python3
(python3-jsonschema, python3-yaml, python3-kubernetes).

What it checks against:

- KubeVirt kinds (kubevirt.io/v1 KubeVirt, VirtualMachine,
  VirtualMachineInstance, ...): the real KubeVirt OpenAPI document,
  third_party/schemas/kubevirt-openapi.json (see third_party/schemas/SOURCES.md).
- CDI kinds (cdi.kubevirt.io/v1beta1 DataVolume, ...): the real CDI OpenAPI
  document, third_party/schemas/cdi-openapi.json.
- Factory's factory.dev/v1alpha1 Tenant: the openAPIV3Schema of
  deploy/kubernetes/tenant-crd.yaml (its root CEL rule on metadata.name is
  not evaluated; the coordinator checks the name again when it reads one).
- The GPU Operator's nvidia.com/v1 ClusterPolicy: the openAPIV3Schema of its
  real CustomResourceDefinition,
  third_party/schemas/gpu-operator-clusterpolicies-crd.yaml (metadata is
  checked by the API server's rules below, as for any CRD;
  x-kubernetes-int-or-string takes both).
- Built-in kinds (v1 Namespace, Secret, Service, Node, ConfigMap, apps/v1
  Deployment, rbac.authorization.k8s.io/v1 ClusterRole, ...): the field lists
  and types of Debian's python3-kubernetes generated models
  (kubernetes.client.models.V1Secret.openapi_types / attribute_map,
  recursively), which are generated from the Kubernetes OpenAPI document.
  Required fields come from the models' setters ("must not be `None`").

How strict: every $ref is resolved into its definition; an object that lists
properties rejects any other field (additionalProperties: false), and so does
an empty struct (KubeVirt's `masquerade: {}`), as a server with
fieldValidation=Strict and a structural CRD schema does. Truly free-form
types (RawExtension, FieldsV1, Patch) stay open; a map field declared with
additionalProperties keeps its value schema. Quantities accept strings and
numbers, IntOrString accepts both, Time accepts null (as the API server's
decoders do). On top of the schemas: the API server's metadata rules (name
syntax per kind, label keys and values) and base64 in Secret.data.

What it does not check: admission webhooks (KubeVirt's VM validation beyond
the schema), defaulting, immutability of fields on update, CEL rules.

Use as a module:

    import k8s_schema
    errors = k8s_schema.validate(obj)   # [] when valid, else "path: message" lines

or from the command line:

    /usr/bin/python3 k8s_schema.py validate FILE.yaml...

Each FILE may hold several YAML (or JSON) documents. Prints one line per
problem ("FILE: doc 2 (VirtualMachine tenant-1): spec.template.spec.foo:
unknown field") and exits 1 if any document is invalid, 0 otherwise.
"""
import base64
import binascii
import copy
import inspect
import json
import os
import re
import sys

import jsonschema
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
SCHEMAS_DIR = os.environ.get(
    "FACTORY_SCHEMAS_DIR",
    os.path.normpath(os.path.join(HERE, "..", "..", "third_party", "schemas")))

# Groups whose kinds come from the OpenAPI documents in third_party/schemas.
OPENAPI_GROUPS = {
    "kubevirt.io": "kubevirt-openapi.json",
    "cdi.kubevirt.io": "cdi-openapi.json",
}

# Groups whose kinds come from a CustomResourceDefinition in third_party/schemas,
# and Factory's own (an absolute path: the CRD `factory install crds` prints,
# kept in deploy/).
CRD_GROUPS = {
    "nvidia.com": "gpu-operator-clusterpolicies-crd.yaml",
    "factory.dev": os.path.normpath(os.path.join(HERE, "..", "..", "deploy", "kubernetes",
                                                 "tenant-crd.yaml")),
}

FREE_FORM_SUFFIXES = (".RawExtension", ".FieldsV1", ".Patch")

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
CONFIG_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")

# Kinds whose names the API server holds to a DNS-1123 label (63 chars, no
# dots) or a DNS-1035 label (must start with a letter); the rest are
# DNS-1123 subdomains.
LABEL_NAMED = {"Namespace", "VirtualMachine", "VirtualMachineInstance"}
DNS1035_NAMED = {"Service"}


class Invalid(Exception):
    """Raised by check() with the list of problems."""

    def __init__(self, errors):
        super().__init__("; ".join(errors))
        self.errors = errors


# ---------------------------------------------------------------- OpenAPI kinds

_openapi_cache = {}


def _close_objects(defs):
    """Makes every object definition strict, as a structural CRD schema with
    strict field validation is."""
    def close(node):
        if isinstance(node, dict):
            if node.get("type") == "object" and "additionalProperties" not in node:
                node["additionalProperties"] = False
            for k, v in list(node.items()):
                if k == "additionalProperties" and isinstance(v, dict):
                    close(v)
                elif k in ("properties",):
                    for p in v.values():
                        close(p)
                elif k == "items":
                    close(v)
        elif isinstance(node, list):
            for v in node:
                close(v)

    for name, d in defs.items():
        if name.endswith(FREE_FORM_SUFFIXES):
            continue
        close(d)
        if name.endswith(".Quantity"):
            d["type"] = ["string", "integer", "number"]
        elif name.endswith(".IntOrString"):
            d["type"] = ["string", "integer"]
            d.pop("format", None)
        elif name.endswith(".Time") or name.endswith(".MicroTime"):
            d["type"] = ["string", "null"]
    return defs


def _openapi(filename):
    if filename not in _openapi_cache:
        with open(os.path.join(SCHEMAS_DIR, filename)) as f:
            doc = json.load(f)
        defs = _close_objects(copy.deepcopy(doc["definitions"]))
        _openapi_cache[filename] = defs
    return _openapi_cache[filename]


def load_openapi_documents():
    """Reads every OpenAPI document now, so a server that validates with them
    fails at start, naming the missing file, rather than on its first write."""
    for filename in list(OPENAPI_GROUPS.values()) + list(CRD_GROUPS.values()):
        path = os.path.join(SCHEMAS_DIR, filename)
        if not os.path.isfile(path):
            raise SystemExit("k8s_schema: no OpenAPI document at %s (third_party/schemas, or $FACTORY_SCHEMAS_DIR)" % path)
        if filename in OPENAPI_GROUPS.values():
            _openapi(filename)


_crd_cache = {}


def _structural(node):
    """A CRD's openAPIV3Schema as jsonschema reads it, closed as a structural
    schema under strict field validation is: unknown fields are errors unless
    x-kubernetes-preserve-unknown-fields says otherwise."""
    if not isinstance(node, dict):
        return node
    out = {}
    for k, v in node.items():
        if k == "properties":
            out[k] = {name: _structural(p) for name, p in v.items()}
        elif k in ("items", "additionalProperties") and isinstance(v, dict):
            out[k] = _structural(v)
        elif k in ("anyOf", "allOf", "oneOf"):
            out[k] = [_structural(x) for x in v]
        elif k.startswith("x-kubernetes-") or k in ("default", "description", "nullable"):
            continue
        else:
            out[k] = v
    if node.get("x-kubernetes-int-or-string"):
        out["type"] = ["integer", "string"]
        out.pop("anyOf", None)
        out.pop("pattern", None)  # applies to the string form only
    if node.get("nullable") and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    if out.get("type") == "object" and "additionalProperties" not in out and \
            not node.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


def _crd_definition(group, version, kind):
    filename = CRD_GROUPS[group]
    if filename not in _crd_cache:
        with open(os.path.join(SCHEMAS_DIR, filename)) as f:
            _crd_cache[filename] = [d for d in yaml.safe_load_all(f) if d]
    for crd in _crd_cache[filename]:
        spec = crd.get("spec") or {}
        if spec.get("group") != group or (spec.get("names") or {}).get("kind") != kind:
            continue
        for v in spec.get("versions") or []:
            if v.get("name") != version:
                continue
            schema = _structural(copy.deepcopy(v["schema"]["openAPIV3Schema"]))
            # The API server checks ObjectMeta itself (_check_metadata below);
            # a CRD's schema may say no more than `type: object` about it.
            schema.setdefault("properties", {})["metadata"] = {"type": "object"}
            name = version + "." + kind
            return name, {name: schema}
    return None, None


def _openapi_definition(group, version, kind):
    defs = _openapi(OPENAPI_GROUPS[group])
    # KubeVirt's document names kinds "v1.VirtualMachine" (and other groups'
    # "v1beta1.X"); no x-kubernetes-group-version-kind to go by.
    name = version + "." + kind
    if name not in defs:
        return None, defs
    return name, defs


# ---------------------------------------------------------------- built-in kinds

_model_cache = {}

PRIMITIVES = {
    "str": {"type": "string"},
    "int": {"type": "integer"},
    "float": {"type": "number"},
    "bool": {"type": "boolean"},
    "object": {},
    "datetime": {"type": ["string", "null"]},
    "date": {"type": ["string", "null"]},
}
# Map fields holding resource.Quantity values: the models say 'str', the API
# server's decoder also takes numbers ("cpu: 2").
QUANTITY_MAPS = {"limits", "requests", "capacity", "allocatable", "hard", "used",
                 "default", "default_request", "max", "min", "max_limit_request_ratio"}
QUANTITY_SCALARS = {"size_limit"}


def _models():
    from kubernetes.client import models
    return models


def _model_schema(cls_name, defs):
    """Adds definitions[cls_name] built from the generated model's field list."""
    if cls_name in defs:
        return
    cls = getattr(_models(), cls_name)
    defs[cls_name] = {}  # placeholder for recursion
    props, required = {}, []
    for attr, typ in cls.openapi_types.items():
        json_name = cls.attribute_map[attr]
        if attr in QUANTITY_MAPS and typ == "dict(str, str)":
            props[json_name] = {"type": "object",
                                "additionalProperties": {"type": ["string", "integer", "number"]}}
        elif attr in QUANTITY_SCALARS and typ == "str":
            props[json_name] = {"type": ["string", "integer", "number"]}
        else:
            props[json_name] = _type_schema(typ, defs)
        prop = getattr(cls, attr, None)
        if isinstance(prop, property) and prop.fset is not None:
            try:
                src = inspect.getsource(prop.fset)
            except (OSError, TypeError):
                src = ""
            if "must not be `None`" in src:
                required.append(json_name)
    schema = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        schema["required"] = required
    defs[cls_name] = schema


def _type_schema(typ, defs):
    typ = typ.strip()
    if typ in PRIMITIVES:
        return dict(PRIMITIVES[typ])
    m = re.match(r"^list\[(.*)\]$", typ)
    if m:
        return {"type": "array", "items": _type_schema(m.group(1), defs)}
    m = re.match(r"^dict\(([^,]+),\s*(.*)\)$", typ)
    if m:
        return {"type": "object", "additionalProperties": _type_schema(m.group(2), defs)}
    _model_schema(typ, defs)
    return {"$ref": "#/definitions/" + typ}


def _model_name(group, version, kind):
    # apps/v1 Deployment -> V1Deployment; v1beta1 -> V1beta1...
    return version[0].upper() + version[1:] + kind


def _builtin_definition(group, version, kind):
    name = _model_name(group, version, kind)
    if not hasattr(_models(), name):
        return None, None
    key = ("builtin",)
    defs = _model_cache.setdefault(key, {})
    _model_schema(name, defs)
    return name, defs


# ---------------------------------------------------------------- validation

_validators = {}


def schema_for(api_version, kind):
    """(validator, source) for the kind, or (None, reason)."""
    key = (api_version, kind)
    if key in _validators:
        return _validators[key]
    group, _, version = api_version.rpartition("/")
    if group in OPENAPI_GROUPS:
        name, defs = _openapi_definition(group, version, kind)
        source = OPENAPI_GROUPS[group]
    elif group in CRD_GROUPS:
        name, defs = _crd_definition(group, version, kind)
        source = CRD_GROUPS[group]
    else:
        name, defs = _builtin_definition(group, version, kind)
        source = "python3-kubernetes models"
    if name is None:
        result = (None, "no schema for %s %s in %s" % (
            api_version, kind,
            OPENAPI_GROUPS.get(group) or CRD_GROUPS.get(group) or "python3-kubernetes models"))
    else:
        root = {"definitions": defs, "$ref": "#/definitions/" + name}
        result = (jsonschema.Draft4Validator(root), source + " " + name)
    _validators[key] = result
    return result


def _path(parts):
    out = ""
    for p in parts:
        if isinstance(p, int):
            out += "[%d]" % p
        else:
            out += ("." if out else "") + str(p)
    return out or "<root>"


def _describe(err):
    """One or more "path: message" lines for a jsonschema error, in the API
    server's words where it has some."""
    path = list(err.absolute_path)
    if err.validator == "additionalProperties" and isinstance(err.instance, dict):
        allowed = set((err.schema.get("properties") or {}).keys())
        return ["%s: unknown field \"%s\"" % (_path(path + [k]), k)
                for k in sorted(err.instance) if k not in allowed]
    if err.validator == "required":
        m = re.search(r"'([^']+)' is a required property", err.message)
        field = m.group(1) if m else "?"
        return ["%s: Required value" % _path(path + [field])]
    if err.validator == "type":
        want = err.validator_value
        return ["%s: Invalid value: %s: must be of type %s" %
                (_path(path), json.dumps(err.instance)[:60],
                 want if isinstance(want, str) else " or ".join(want))]
    if err.validator == "enum":
        return ["%s: Unsupported value: %s: supported values: %s" %
                (_path(path), json.dumps(err.instance), ", ".join(json.dumps(v) for v in err.validator_value))]
    return ["%s: %s" % (_path(path), err.message)]


def _check_metadata(obj, errors):
    kind = obj.get("kind", "")
    md = obj.get("metadata")
    if not isinstance(md, dict):
        errors.append("metadata: Required value")
        return
    name = md.get("name")
    if not name and not md.get("generateName"):
        errors.append("metadata.name: Required value: name or generateName is required")
    elif isinstance(name, str) and name:
        if kind in DNS1035_NAMED:
            ok = len(name) <= 63 and DNS1035_LABEL.match(name)
            rule = "a DNS-1035 label (lower-case letters, digits and '-', starting with a letter, at most 63 characters)"
        elif kind in LABEL_NAMED:
            ok = len(name) <= 63 and DNS1123_LABEL.match(name)
            rule = "a DNS-1123 label (lower-case letters, digits and '-', at most 63 characters)"
        else:
            ok = len(name) <= 253 and DNS1123_SUBDOMAIN.match(name)
            rule = "a DNS-1123 subdomain (lower-case letters, digits, '-' and '.', at most 253 characters)"
        if not ok:
            errors.append("metadata.name: Invalid value: %s: must be %s" % (json.dumps(name), rule))
    ns = md.get("namespace")
    if isinstance(ns, str) and ns and not (len(ns) <= 63 and DNS1123_LABEL.match(ns)):
        errors.append("metadata.namespace: Invalid value: %s: must be a DNS-1123 label" % json.dumps(ns))
    for field in ("labels", "annotations"):
        items = md.get(field)
        if not isinstance(items, dict):
            continue
        for k, v in items.items():
            prefix, _, nm = k.rpartition("/")
            if (prefix and not (len(prefix) <= 253 and DNS1123_SUBDOMAIN.match(prefix))) or \
                    not (len(nm) <= 63 and LABEL_NAME.match(nm)):
                errors.append("metadata.%s: Invalid value: %s: not a valid label key" % (field, json.dumps(k)))
            if field == "labels" and isinstance(v, str) and not (len(v) <= 63 and LABEL_VALUE.match(v)):
                errors.append("metadata.labels: Invalid value: %s: a label value must be at most 63 "
                              "characters of letters, digits, '-', '_' or '.'" % json.dumps(v))


def _check_kind_specific(obj, errors):
    kind = obj.get("kind")
    if kind in ("Secret", "ConfigMap"):
        for field in ("data", "stringData", "binaryData"):
            items = obj.get(field)
            if not isinstance(items, dict):
                continue
            for k, v in items.items():
                if not (len(k) <= 253 and CONFIG_KEY.match(k)):
                    errors.append("%s[%s]: Invalid value: a valid config key must consist of "
                                  "alphanumeric characters, '-', '_' or '.'" % (field, json.dumps(k)))
                if kind == "Secret" and field == "data" and isinstance(v, str):
                    try:
                        base64.b64decode(v, validate=True)
                    except (binascii.Error, ValueError):
                        errors.append("data[%s]: Invalid value: illegal base64 data" % json.dumps(k))


def validate(obj):
    """Returns a list of "path: message" strings; empty when obj is valid."""
    if not isinstance(obj, dict):
        return ["<root>: a Kubernetes object must be a mapping"]
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if not isinstance(api_version, str) or not api_version:
        return ["apiVersion: Required value"]
    if not isinstance(kind, str) or not kind:
        return ["kind: Required value"]
    validator, source = schema_for(api_version, kind)
    if validator is None:
        return ["<root>: " + source]
    errors = []
    for err in sorted(validator.iter_errors(obj), key=lambda e: list(map(str, e.absolute_path))):
        errors.extend(_describe(err))
    _check_metadata(obj, errors)
    _check_kind_specific(obj, errors)
    # One line per distinct problem, in a stable order.
    seen, out = set(), []
    for e in errors:
        if e not in seen:
            seen.add(e)
            out.append(e)
    return out


def check(obj):
    errors = validate(obj)
    if errors:
        raise Invalid(errors)


def load_documents(path):
    with open(path) as f:
        text = f.read()
    return [d for d in yaml.safe_load_all(text) if d is not None]


def main(argv):
    if len(argv) < 2 or argv[0] != "validate":
        sys.stderr.write("usage: k8s_schema.py validate FILE.yaml...\n")
        return 2
    bad = False
    for path in argv[1:]:
        try:
            docs = load_documents(path)
        except (OSError, yaml.YAMLError) as e:
            print("%s: cannot read: %s" % (path, str(e).replace("\n", " ")))
            bad = True
            continue
        for i, doc in enumerate(docs, 1):
            label = "%s %s" % (doc.get("kind", "?"), (doc.get("metadata") or {}).get("name", "?")) \
                if isinstance(doc, dict) else "?"
            errors = validate(doc)
            for e in errors:
                print("%s: doc %d (%s): %s" % (path, i, label, e))
            if errors:
                bad = True
            else:
                print("%s: doc %d (%s): valid" % (path, i, label))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
