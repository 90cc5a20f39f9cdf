//! Random and mutated inputs fed through the functions requests use: none may panic.

use super::*;
use bytes::Bytes;
use rand::{Rng, SeedableRng};

use crate::admission;
use crate::patch;
use crate::query::{FieldSelector, LabelSelector};
use crate::resources;
use crate::services;

use super::reads::{decode_continue, freshness};
use super::update::{bump_generation, check_immutable, scale_of};

const SEEDS: &[&str] = &[
    r#"{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"web","labels":{"app":"web"}},"spec":{"replicas":2,"selector":{"matchLabels":{"app":"web"}},"template":{"metadata":{"labels":{"app":"web"}},"spec":{"containers":[{"name":"c","image":"nginx","ports":[{"containerPort":80}],"resources":{"limits":{"cpu":"1"}}}]}}}}"#,
    r#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"s"},"spec":{"type":"NodePort","ports":[{"port":80,"nodePort":30001}],"selector":{"a":"b"}}}"#,
    r#"[{"op":"add","path":"/metadata/labels/x","value":"1"},{"op":"move","from":"/spec","path":"/spec2"},{"op":"test","path":"/a/0","value":null}]"#,
    r#"{"metadata":{"labels":{"a":null}},"spec":{"template":{"spec":{"containers":[{"name":"c","$patch":"delete"}]}}}}"#,
];

fn mutate(rng: &mut rand::rngs::StdRng, seed: &str) -> Vec<u8> {
    let mut b = seed.as_bytes().to_vec();
    for _ in 0..rng.gen_range(1..8) {
        let pos = rng.gen_range(0..=b.len());
        match rng.gen_range(0..4) {
            0 if !b.is_empty() => {
                let i = rng.gen_range(0..b.len());
                b[i] = rng.gen();
            }
            1 => {
                let s: &[u8] = [
                    &b"{"[..],
                    b"}",
                    b"[",
                    b"]",
                    b"\"",
                    b":",
                    b",",
                    b"null",
                    b"-1",
                    b"1e999",
                    b"\"\\u0000\"",
                ][rng.gen_range(0..11)];
                b.splice(pos..pos, s.iter().copied());
            }
            2 if pos < b.len() => {
                let end = rng.gen_range(pos..b.len());
                b.drain(pos..end);
            }
            _ => {
                let i = rng.gen_range(0..=b.len());
                b.truncate(i);
            }
        }
    }
    b
}

fn random_value(rng: &mut rand::rngs::StdRng, depth: usize) -> Value {
    match if depth > 3 {
        rng.gen_range(0..4)
    } else {
        rng.gen_range(0..6)
    } {
        0 => Value::Null,
        1 => json!(rng.gen::<i32>()),
        2 => {
            json!(["name", "image", "spec", "status", "", "0", "-", "~1"][rng.gen_range(0..8)])
        }
        3 => json!(rng.gen::<bool>()),
        4 => Value::Array(
            (0..rng.gen_range(0..4))
                .map(|_| random_value(rng, depth + 1))
                .collect(),
        ),
        _ => {
            let keys = [
                "metadata",
                "spec",
                "status",
                "containers",
                "labels",
                "name",
                "ports",
                "nodePort",
                "clusterIP",
                "replicas",
                "selector",
                "template",
                "resources",
                "limits",
                "$patch",
                "op",
                "path",
                "value",
                "from",
            ];
            Value::Object(
                (0..rng.gen_range(0..5))
                    .map(|_| {
                        (
                            keys[rng.gen_range(0..keys.len())].to_string(),
                            random_value(rng, depth + 1),
                        )
                    })
                    .collect(),
            )
        }
    }
}

#[test]
fn random_input_is_an_error_never_a_panic() {
    // RKUBE_FUZZ_SEED and RKUBE_FUZZ_ROUNDS run it longer or differently (see README).
    let seed = std::env::var("RKUBE_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7);
    let rounds = std::env::var("RKUBE_FUZZ_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3000);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let net = ServiceNet::default();
    let authz = crate::rbac::Authorizer::new();
    let tokens = crate::token::tests::test_key();
    let folders = [
        "/registry/clusterroles/",
        "/registry/roles/",
        "/registry/clusterrolebindings/",
        "/registry/rolebindings/",
    ];
    for round in 0..rounds {
        let seed = SEEDS[round % SEEDS.len()];
        let bytes = Bytes::from(mutate(&mut rng, seed));
        let _ = decode_body(&bytes, "application/json");
        let _ = decode_body(&bytes, "application/yaml");
        let _ = decode_body(&bytes, "text/plain");
        let target = random_value(&mut rng, 0);
        let patch =
            serde_json::from_slice::<Value>(&bytes).unwrap_or_else(|_| random_value(&mut rng, 0));
        let mut doc = target.clone();
        let _ = patch::json_patch(&mut doc, &patch);
        patch::merge_patch(&mut doc, &patch);
        let _ = decode_body(&bytes, "application/vnd.kubernetes.protobuf");
        let mut proto = b"k8s\0".to_vec();
        proto.extend_from_slice(&bytes);
        let _ = crate::protobuf::decode(&proto);
        for def in [
            Some("io.k8s.api.apps.v1.Deployment"),
            Some("io.k8s.api.core.v1.Service"),
            None,
        ] {
            let mut doc = target.clone();
            let _ = crate::strategic::apply(def, &mut doc, &patch);
            let live = crate::apply::apply(def, None, &target, "a", false, "v1", "t");
            if let Ok(live) = live {
                let _ =
                    crate::apply::apply(def, Some(&live), &patch, "b", round % 2 == 0, "v1", "t");
            }
        }
        for res in resources::RESOURCES {
            let mut o = random_value(&mut rng, 0);
            admission::defaults(res, &mut o);
            let _ = admission::validate(res, &o);
            let _ = crate::quota::usage(res, &o);
            let _ = bump_generation(res, &target, o.clone());
            let _ = check_immutable(res, &target, &o);
            let _ = scale_of(res, &o);
            let _ = crate::table::table(res, std::slice::from_ref(&o), json!({}), "Object");
        }
        let mut svc = random_value(&mut rng, 0);
        let _ = services::allocate(&net, &mut svc);
        let text = String::from_utf8_lossy(&bytes).to_string();
        let _ = LabelSelector::parse(&text);
        let _ = FieldSelector::parse(&text, "Pod");
        let _ = decode_continue(&text);
        let q = Query::parse(Some(&text));
        let _ = freshness(&q);
        let _ = q.dry_run();
        let segs: Vec<&str> = text.split('/').collect();
        let _ = parse_target("", "v1", &segs);
        let _ = rkube_core::quantity::parse_quantity(&text);
        // Authentication and authorization: random tokens, RBAC objects and requests.
        let _ = tokens.verify(&text);
        let folder = folders[round % folders.len()];
        authz.load_at(folder, &text, &random_value(&mut rng, 0));
        authz.load_at(folder, "ns/x", &patch);
        let user = crate::auth::User {
            name: text.clone(),
            groups: vec![text.clone()],
            ..Default::default()
        };
        let _ = authz.authorize(
            &user,
            &Attributes::resource("get", &text, &text, "", "ns", ""),
        );
        let _ = authz.authorize(&user, &Attributes::path(&text, &text));
        let _ = authz.rules_for(&user, "ns");
        let _ = authz.aggregations();
        // events.k8s.io conversion of bodies, patches and selectors.
        for ct in [
            "application/json",
            "application/yaml",
            "application/json-patch+json",
            "application/merge-patch+json",
            "application/apply-patch+yaml",
            "text/plain",
        ] {
            let _ = crate::events::EVENTS.body_to_stored(&bytes, ct);
        }
        let _ = crate::events::query_to_core(&Query::parse(Some(&format!("fieldSelector={text}"))));
    }
}
