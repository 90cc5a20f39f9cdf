//! The operations of every served resource, described once and written out as Swagger 2.0
//! paths or OpenAPI v3 paths.
//!
//! kubectl reads these: it sends `fieldValidation` only when the PATCH operation of a kind (found
//! by its `x-kubernetes-group-version-kind`) lists that query parameter, and it computes
//! strategic merge patches only for kinds whose PATCH accepts that media type.

use serde_json::{json, Map, Value};

use super::schemas::{self, Schemas};
use crate::resources::Resource;

/// A parameter: where it goes, its type, and what it does.
#[derive(Clone, Copy)]
struct Param {
    name: &'static str,
    loc: &'static str,
    ty: &'static str,
    desc: &'static str,
}

const fn query(name: &'static str, ty: &'static str, desc: &'static str) -> Param {
    Param {
        name,
        loc: "query",
        ty,
        desc,
    }
}

const PRETTY: Param = query(
    "pretty",
    "string",
    "If 'true', then the output is pretty printed.",
);
const DRY_RUN: Param = query(
    "dryRun",
    "string",
    "When present, indicates that modifications should not be persisted. The only valid value is All: the request is processed in full but nothing is stored.",
);
const FIELD_MANAGER: Param = query(
    "fieldManager",
    "string",
    "A name associated with the actor or entity that is making these changes.",
);
const FIELD_VALIDATION: Param = query(
    "fieldValidation",
    "string",
    "What the server does with unknown and duplicate fields in the body: Ignore drops them silently, Warn (the default) accepts the request and answers a warning header for each, Strict rejects the request with a BadRequest that names every one.",
);
const FORCE: Param = query(
    "force",
    "boolean",
    "Force is going to \"force\" Apply requests. It must be unset for requests that are not apply patches.",
);
const LIST_PARAMS: &[Param] = &[
    query("allowWatchBookmarks", "boolean", "allowWatchBookmarks requests watch events with type \"BOOKMARK\"."),
    query("continue", "string", "The continue option should be set when retrieving more results from the server: the value the previous page's list metadata returned."),
    query("fieldSelector", "string", "A selector to restrict the list of returned objects by their fields. Defaults to everything."),
    query("labelSelector", "string", "A selector to restrict the list of returned objects by their labels. Defaults to everything."),
    query("limit", "integer", "The maximum number of responses to return for a list call; more remain when the list metadata has a continue token."),
    query("resourceVersion", "string", "Constrains which resource versions the request may be served from: unset for the most recent, 0 for any."),
    query("resourceVersionMatch", "string", "How resourceVersion applies to list calls: Exact or NotOlderThan."),
    query("sendInitialEvents", "boolean", "With watch=true, whether the watch starts with synthetic events for the current state."),
    query("timeoutSeconds", "integer", "Timeout for the list/watch call, whatever the activity."),
    query("watch", "boolean", "Watch for changes to the described resources and return them as a stream of add, update, and remove notifications."),
];
const DELETE_PARAMS: &[Param] = &[
    DRY_RUN,
    query(
        "gracePeriodSeconds",
        "integer",
        "The duration in seconds before the object should be deleted.",
    ),
    query(
        "orphanDependents",
        "boolean",
        "Deprecated: use propagationPolicy. Whether the dependent objects should be orphaned.",
    ),
    query(
        "propagationPolicy",
        "string",
        "Whether and how garbage collection will be performed: Orphan, Background or Foreground.",
    ),
];
const PATCH_TYPES: &[&str] = &[
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
];

/// One operation of one path.
struct Op {
    method: &'static str,
    id: String,
    action: &'static str,
    desc: String,
    params: Vec<Param>,
    /// The definition the body carries, if any.
    body: Option<String>,
    patch: bool,
    /// Status codes answered with `response`.
    codes: &'static [u16],
    response: String,
    gvk: (String, String, String),
    tag: String,
}

/// A path and its operations, with path parameters.
pub struct PathItem {
    pub path: String,
    path_params: Vec<Param>,
    ops: Vec<Op>,
}

fn camel(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

/// `Core`, `Apps`, `RbacAuthorization`: the group in operation ids.
fn group_id(group: &str) -> String {
    if group.is_empty() {
        return "Core".into();
    }
    group
        .trim_end_matches(".k8s.io")
        .split('.')
        .map(camel)
        .collect()
}

/// `core_v1`, `rbacAuthorization_v1`: the tag of a group version's operations.
fn tag(group: &str, version: &str) -> String {
    let g = group_id(group);
    let mut c = g.chars();
    let lower: String = match c.next() {
        Some(f) => f.to_lowercase().chain(c).collect(),
        None => String::new(),
    };
    format!("{lower}_{version}")
}

pub fn prefix(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("/api/{version}")
    } else {
        format!("/apis/{group}/{version}")
    }
}

/// The paths of one resource.
pub fn resource_paths(r: &Resource, s: &Schemas) -> Vec<PathItem> {
    let Some(def) = s.kind_def(r.group, r.version, r.kind).map(str::to_string) else {
        return Vec::new();
    };
    let list = schemas::list_name(&def);
    let base = prefix(r.group, r.version);
    let gid = format!("{}{}", group_id(r.group), camel(r.version));
    let ns_word = if r.namespaced { "Namespaced" } else { "" };
    let tag = tag(r.group, r.version);
    let gvk = (
        r.group.to_string(),
        r.version.to_string(),
        r.kind.to_string(),
    );
    let op = |method, verb: &str, action, desc: String, suffix: &str| Op {
        method,
        id: format!("{verb}{gid}{ns_word}{}{suffix}", r.kind),
        action,
        desc,
        params: Vec::new(),
        body: None,
        patch: false,
        codes: &[200],
        response: def.clone(),
        gvk: gvk.clone(),
        tag: tag.clone(),
    };
    let name_param = Param {
        name: "name",
        loc: "path",
        ty: "string",
        desc: "name of the object",
    };
    let ns_param = Param {
        name: "namespace",
        loc: "path",
        ty: "string",
        desc: "object name and auth scope, such as for teams and projects",
    };
    let (collection, mut scope_params) = if r.namespaced {
        (
            format!("{base}/namespaces/{{namespace}}/{}", r.plural),
            vec![ns_param],
        )
    } else {
        (format!("{base}/{}", r.plural), vec![])
    };
    scope_params.push(PRETTY);
    let mut out = Vec::new();

    // The collection.
    let mut ops = Vec::new();
    if r.serves("list") {
        let mut o = op(
            "get",
            "list",
            "list",
            format!("list or watch objects of kind {}", r.kind),
            "",
        );
        o.params = LIST_PARAMS.to_vec();
        o.response = list.clone();
        ops.push(o);
    }
    if r.serves("create") {
        let mut o = op("post", "create", "post", format!("create a {}", r.kind), "");
        o.params = vec![DRY_RUN, FIELD_MANAGER, FIELD_VALIDATION];
        o.body = Some(def.clone());
        o.codes = &[200, 201, 202];
        ops.push(o);
    }
    if r.serves("deletecollection") {
        let mut o = op(
            "delete",
            "deleteCollection",
            "deletecollection",
            format!("delete collection of {}", r.kind),
            "",
        );
        o.params = LIST_PARAMS
            .iter()
            .filter(|p| p.name != "watch" && p.name != "allowWatchBookmarks")
            .chain(DELETE_PARAMS)
            .copied()
            .collect();
        o.body = Some(schemas::DELETE_OPTIONS.into());
        o.response = schemas::STATUS.into();
        ops.push(o);
    }
    out.push(PathItem {
        path: collection.clone(),
        path_params: scope_params.clone(),
        ops,
    });

    // Every namespace's objects at once.
    if r.namespaced && r.serves("list") {
        let mut o = op(
            "get",
            "list",
            "list",
            format!("list or watch objects of kind {}", r.kind),
            "ForAllNamespaces",
        );
        o.id = format!("list{gid}{}ForAllNamespaces", r.kind);
        o.params = LIST_PARAMS.to_vec();
        o.response = list.clone();
        out.push(PathItem {
            path: format!("{base}/{}", r.plural),
            path_params: vec![PRETTY],
            ops: vec![o],
        });
    }

    // One object.
    if r.serves("get") {
        let mut item_params = vec![name_param];
        item_params.extend(scope_params.iter().copied());
        let mut ops = vec![op(
            "get",
            "read",
            "get",
            format!("read the specified {}", r.kind),
            "",
        )];
        let mut o = op(
            "put",
            "replace",
            "put",
            format!("replace the specified {}", r.kind),
            "",
        );
        o.params = vec![DRY_RUN, FIELD_MANAGER, FIELD_VALIDATION];
        o.body = Some(def.clone());
        o.codes = &[200, 201];
        ops.push(o);
        let mut o = op(
            "patch",
            "patch",
            "patch",
            format!("partially update the specified {}", r.kind),
            "",
        );
        o.params = vec![DRY_RUN, FIELD_MANAGER, FIELD_VALIDATION, FORCE];
        o.body = Some(schemas::PATCH.into());
        o.patch = true;
        o.codes = &[200, 201];
        ops.push(o);
        let mut o = op(
            "delete",
            "delete",
            "delete",
            format!("delete a {}", r.kind),
            "",
        );
        o.params = DELETE_PARAMS.to_vec();
        o.body = Some(schemas::DELETE_OPTIONS.into());
        o.codes = &[200, 202];
        ops.push(o);
        out.push(PathItem {
            path: format!("{collection}/{{name}}"),
            path_params: item_params.clone(),
            ops,
        });

        // Its subresources.
        for sub in r.subresources {
            let suffix = camel(sub);
            let (def_sub, sub_gvk, verbs): (String, (String, String, String), &[&str]) = match *sub
            {
                "scale" => (
                    s.kind_def("autoscaling", "v1", "Scale")
                        .unwrap_or_default()
                        .to_string(),
                    ("autoscaling".into(), "v1".into(), "Scale".into()),
                    &["get", "put", "patch"],
                ),
                "binding" => (
                    s.kind_def("", "v1", "Binding")
                        .unwrap_or_default()
                        .to_string(),
                    ("".into(), "v1".into(), "Binding".into()),
                    &["post"],
                ),
                "eviction" => (
                    s.kind_def("policy", "v1", "Eviction")
                        .unwrap_or_default()
                        .to_string(),
                    ("policy".into(), "v1".into(), "Eviction".into()),
                    &["post"],
                ),
                "token" => (
                    s.kind_def("authentication.k8s.io", "v1", "TokenRequest")
                        .unwrap_or_default()
                        .to_string(),
                    (
                        "authentication.k8s.io".into(),
                        "v1".into(),
                        "TokenRequest".into(),
                    ),
                    &["post"],
                ),
                "finalize" => (def.clone(), gvk.clone(), &["put"]),
                _ => (def.clone(), gvk.clone(), &["get", "put", "patch"]),
            };
            if def_sub.is_empty() {
                continue;
            }
            let mut ops = Vec::new();
            for verb in verbs {
                let mut o = match *verb {
                    "get" => op(
                        "get",
                        "read",
                        "get",
                        format!("read {sub} of the specified {}", r.kind),
                        &suffix,
                    ),
                    "put" => {
                        let mut o = op(
                            "put",
                            "replace",
                            "put",
                            format!("replace {sub} of the specified {}", r.kind),
                            &suffix,
                        );
                        o.params = vec![DRY_RUN, FIELD_MANAGER, FIELD_VALIDATION];
                        o.body = Some(def_sub.clone());
                        o.codes = &[200, 201];
                        o
                    }
                    "patch" => {
                        let mut o = op(
                            "patch",
                            "patch",
                            "patch",
                            format!("partially update {sub} of the specified {}", r.kind),
                            &suffix,
                        );
                        o.params = vec![DRY_RUN, FIELD_MANAGER, FIELD_VALIDATION, FORCE];
                        o.body = Some(schemas::PATCH.into());
                        o.patch = true;
                        o.codes = &[200, 201];
                        o
                    }
                    _ => {
                        let mut o = op(
                            "post",
                            "create",
                            "post",
                            format!("create {sub} of a {}", r.kind),
                            &suffix,
                        );
                        o.params = vec![DRY_RUN, FIELD_MANAGER, FIELD_VALIDATION];
                        o.body = Some(def_sub.clone());
                        o.codes = &[200, 201, 202];
                        o
                    }
                };
                o.response = def_sub.clone();
                o.gvk = sub_gvk.clone();
                ops.push(o);
            }
            out.push(PathItem {
                path: format!("{collection}/{{name}}/{sub}"),
                path_params: item_params.clone(),
                ops,
            });
        }
    }
    out
}

/// `/api/v1/` or `/apis/<group>/<version>/`: the group version's resources.
pub fn discovery_path(group: &str, version: &str) -> PathItem {
    PathItem {
        path: format!("{}/", prefix(group, version)),
        path_params: vec![],
        ops: vec![Op {
            method: "get",
            id: format!("get{}{}APIResources", group_id(group), camel(version)),
            action: "",
            desc: "get available resources".into(),
            params: vec![],
            body: None,
            patch: false,
            codes: &[200],
            response: schemas::RESOURCE_LIST.into(),
            gvk: (String::new(), String::new(), String::new()),
            tag: tag(group, version),
        }],
    }
}

impl PathItem {
    /// The definitions the operations name.
    pub fn refs(&self) -> Vec<&str> {
        let mut out = Vec::new();
        for o in &self.ops {
            out.push(o.response.as_str());
            if let Some(b) = &o.body {
                out.push(b.as_str());
            }
        }
        out.push(schemas::STATUS);
        out
    }

    pub fn v2(&self) -> Value {
        let mut item = Map::new();
        for o in &self.ops {
            let mut params: Vec<Value> = self
                .path_params
                .iter()
                .chain(&o.params)
                .map(|p| {
                    let mut v = json!({"name": p.name, "in": p.loc, "type": p.ty, "description": p.desc, "uniqueItems": true});
                    if p.loc == "path" {
                        v["required"] = json!(true);
                    }
                    v
                })
                .collect();
            if let Some(b) = &o.body {
                params.push(
                    json!({"name": "body", "in": "body", "required": o.method != "delete",
                                   "schema": {"$ref": format!("#/definitions/{b}")}}),
                );
            }
            let mut responses = Map::new();
            for c in o.codes {
                responses.insert(
                    c.to_string(),
                    json!({"description": status_text(*c),
                    "schema": {"$ref": format!("#/definitions/{}", o.response)}}),
                );
            }
            responses.insert("401".into(), json!({"description": "Unauthorized"}));
            let mut op = json!({
                "description": o.desc,
                "operationId": o.id,
                "tags": [o.tag],
                "schemes": ["https"],
                "consumes": if o.patch { json!(PATCH_TYPES) } else { json!(["*/*"]) },
                "produces": produces(o),
                "parameters": params,
                "responses": responses,
            });
            extensions(o, &mut op);
            item.insert(o.method.into(), op);
        }
        Value::Object(item)
    }

    pub fn v3(&self) -> Value {
        let mut item = Map::new();
        for o in &self.ops {
            let params: Vec<Value> = self
                .path_params
                .iter()
                .chain(&o.params)
                .map(|p| {
                    let mut v = json!({"name": p.name, "in": p.loc, "description": p.desc,
                                       "schema": {"type": p.ty, "uniqueItems": true}});
                    if p.loc == "path" {
                        v["required"] = json!(true);
                    }
                    v
                })
                .collect();
            let content = |def: &str, types: &[&str]| -> Value {
                let schema = json!({"$ref": format!("#/components/schemas/{def}")});
                Value::Object(
                    types
                        .iter()
                        .map(|t| (t.to_string(), json!({"schema": schema})))
                        .collect(),
                )
            };
            let mut responses = Map::new();
            let produced: Vec<String> = produces(o)
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t.as_str().map(str::to_string))
                .collect();
            let produced: Vec<&str> = produced.iter().map(String::as_str).collect();
            for c in o.codes {
                responses.insert(
                    c.to_string(),
                    json!({"description": status_text(*c),
                    "content": content(&o.response, &produced)}),
                );
            }
            responses.insert("401".into(), json!({"description": "Unauthorized"}));
            let mut op = json!({
                "description": o.desc,
                "operationId": o.id,
                "tags": [o.tag],
                "parameters": params,
                "responses": responses,
            });
            if let Some(b) = &o.body {
                let types: &[&str] = if o.patch { PATCH_TYPES } else { &["*/*"] };
                op["requestBody"] =
                    json!({"content": content(b, types), "required": o.method != "delete"});
            }
            extensions(o, &mut op);
            item.insert(o.method.into(), op);
        }
        Value::Object(item)
    }
}

fn produces(o: &Op) -> Value {
    if o.action == "list" {
        json!([
            "application/json",
            "application/yaml",
            "application/json;stream=watch"
        ])
    } else {
        json!(["application/json", "application/yaml"])
    }
}

fn extensions(o: &Op, op: &mut Value) {
    if !o.action.is_empty() {
        op["x-kubernetes-action"] = json!(o.action);
    }
    if !o.gvk.2.is_empty() {
        op["x-kubernetes-group-version-kind"] =
            json!({"group": o.gvk.0, "version": o.gvk.1, "kind": o.gvk.2});
    }
}

fn status_text(code: u16) -> &'static str {
    match code {
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        _ => "Unauthorized",
    }
}
