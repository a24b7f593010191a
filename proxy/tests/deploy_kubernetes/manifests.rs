//! Reads deploy/kubernetes/'s manifests as the API server would see them: every document of every file, the pod
//! template of each workload, its proxy containers, their `$(VAR)` references expanded from the container's `env`
//! as the kubelet expands them, and named ports resolved to numbers.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_yaml_ng::Value;

/// The image the manifests run (any tag).
pub const PROXY_IMAGE: &str = "etcd-grpc-proxy:";

/// What `status.podIP` stands for when a test expands `$(POD_IP)`: an address of the documentation range
/// (RFC 5737), parsed only, never dialed.
pub const POD_IP: &str = "192.0.2.10";

/// The directory of the manifests.
pub fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes")
}

/// One document of a manifest file, with the file it came from.
pub struct Resource {
    pub file: String,
    pub value: Value,
}

impl Resource {
    pub fn kind(&self) -> &str {
        self.value["kind"].as_str().unwrap_or_default()
    }

    pub fn name(&self) -> &str {
        self.value["metadata"]["name"].as_str().unwrap_or_default()
    }

    /// `file: Kind/name`, for messages.
    pub fn id(&self) -> String {
        format!("{}: {}/{}", self.file, self.kind(), self.name())
    }

    /// The pod template's spec of a workload (`None` for other kinds).
    pub fn pod_spec(&self) -> Option<&Value> {
        match self.kind() {
            "Deployment" | "DaemonSet" | "StatefulSet" | "ReplicaSet" | "Job" => {
                Some(&self.value["spec"]["template"]["spec"])
            }
            "Pod" => Some(&self.value["spec"]),
            _ => None,
        }
    }

    /// The pod template's labels of a workload.
    pub fn pod_labels(&self) -> &Value {
        &self.value["spec"]["template"]["metadata"]["labels"]
    }

    /// The containers of the pod template that run the proxy's image.
    pub fn proxy_containers(&self) -> Vec<&Value> {
        let Some(spec) = self.pod_spec() else {
            return Vec::new();
        };
        seq(&spec["containers"])
            .iter()
            .chain(seq(&spec["initContainers"]))
            .filter(|c| {
                c["image"]
                    .as_str()
                    .is_some_and(|i| i.starts_with(PROXY_IMAGE))
            })
            .collect()
    }
}

/// Every document of every `.yaml`/`.yml` file of deploy/kubernetes/, in file-name order. A file that is not YAML,
/// or has a mapping with a key twice (the API server's strict decoding refuses those), fails the test.
pub fn all() -> Vec<Resource> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir())
        .expect("read deploy/kubernetes")
        .map(|entry| entry.expect("directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no manifests in {}", dir().display());
    let mut out = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path).expect("read a manifest");
        let file = path
            .file_name()
            .expect("file name")
            .to_string_lossy()
            .into_owned();
        for document in serde_yaml_ng::Deserializer::from_str(&text) {
            let value = Value::deserialize(document)
                .unwrap_or_else(|e| panic!("{file} is not valid YAML: {e}"));
            if !value.is_null() {
                out.push(Resource {
                    file: file.clone(),
                    value,
                });
            }
        }
    }
    out
}

/// A sequence's items (none for a missing one).
pub fn seq(value: &Value) -> &[Value] {
    value.as_sequence().map(Vec::as_slice).unwrap_or_default()
}

/// `container`'s args with every `$(VAR)` replaced as the kubelet replaces it, from the container's `env` (a
/// `value`, or `status.podIP` from the downward API). A reference to a variable the container does not define would
/// reach the proxy as the literal text: that fails the test.
pub fn expanded_args(container: &Value) -> Vec<String> {
    seq(&container["args"])
        .iter()
        .map(|arg| {
            let arg = arg
                .as_str()
                .unwrap_or_else(|| panic!("an arg that is not a string: {arg:?}"));
            expand(arg, container)
        })
        .collect()
}

fn expand(arg: &str, container: &Value) -> String {
    let mut out = String::new();
    let mut rest = arg;
    while let Some(start) = rest.find("$(") {
        out.push_str(&rest[..start]);
        let end = rest[start..]
            .find(')')
            .unwrap_or_else(|| panic!("{arg:?}: an unclosed $("));
        let name = &rest[start + 2..start + end];
        out.push_str(&env_value(container, name));
        rest = &rest[start + end + 1..];
    }
    out.push_str(rest);
    out
}

fn env_value(container: &Value, name: &str) -> String {
    let var = seq(&container["env"])
        .iter()
        .find(|v| v["name"].as_str() == Some(name))
        .unwrap_or_else(|| {
            panic!("$({name}) is used in args but not defined in the container's env")
        });
    if let Some(value) = var["value"].as_str() {
        return value.to_owned();
    }
    match var["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
        Some("status.podIP") => POD_IP.to_owned(),
        other => panic!("$({name}): a source this test does not expand: {other:?}"),
    }
}

/// A probe's or Service's port (a number, or the name of one of `container`'s ports) as a number.
pub fn port_number(port: &Value, container: &Value) -> u16 {
    if let Some(number) = port.as_u64() {
        return u16::try_from(number).expect("a port number");
    }
    let name = port.as_str().unwrap_or_else(|| panic!("a port: {port:?}"));
    let declared = seq(&container["ports"])
        .iter()
        .find(|p| p["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("port {name:?} is not one of the container's ports"));
    port_number(&declared["containerPort"], container)
}

/// Whether every label of `selector` (a `matchLabels` map) is on `labels`, and there is at least one.
pub fn selects(selector: &Value, labels: &Value) -> bool {
    let Some(wanted) = selector.as_mapping() else {
        return false;
    };
    !wanted.is_empty() && wanted.iter().all(|(k, v)| labels.get(k) == Some(v))
}
