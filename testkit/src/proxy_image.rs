//! The proxy's container image (`deploy/container/Dockerfile`, built by `ci/container-image.sh`) run through
//! testcontainers, for the conformance suite's `container` target: the same binary as the kit's release build, as
//! operators run it from the image.
//!
//! [`image`] builds the image once per test process from the release binary it is given (the script keeps an image already
//! labelled with that binary's sha256, so a test never runs a stale image). [`ImageRun`] is one container of it:
//! on the host's network, its output copied to a log file, its files (certificates and keys named by its flags)
//! copied into a directory owned by the image's non-root user (its `USER`, read from the image) and mounted
//! read-only, as an operator mounts a Secret. Dropping it removes the container (testcontainers' drop, inside the caller's tokio runtime).

use std::os::unix::fs::chown;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use testcontainers::core::{AccessMode, Mount};
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};
use tokio::io::AsyncWriteExt as _;

use crate::dirs;

/// Where a container finds the files its flags name.
pub const FILES_DIR: &str = "/etc/etcd-grpc-proxy/files";

/// The image reference (`etcd-grpc-proxy:<version>`) holding `bin`, the proxy's release binary (the same one for
/// the whole test process): built or confirmed by `ci/container-image.sh` on first use, with the Docker daemon
/// `DOCKER_HOST` names.
pub fn image(bin: &Path) -> Result<String, String> {
    static IMAGE: OnceLock<Result<String, String>> = OnceLock::new();
    IMAGE.get_or_init(|| build_image(bin)).clone()
}

fn build_image(bin: &Path) -> Result<String, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .ok_or("the testkit crate has no parent directory")?;
    let out = Command::new(root.join("ci/container-image.sh"))
        .arg(bin)
        .current_dir(root)
        .output()
        .map_err(|e| format!("run ci/container-image.sh: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "ci/container-image.sh {} failed ({}): {}",
            bin.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let image = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if image.is_empty() {
        return Err("ci/container-image.sh printed no image".into());
    }
    Ok(image)
}

/// One running container of the image.
pub struct ImageRun {
    container: ContainerAsync<GenericImage>,
    pid: u32,
    _files: tempfile::TempDir,
}

impl ImageRun {
    /// Starts `image` with `args` (after its entry point, `etcd-grpc-proxy start`) on the host's network, its
    /// output appended to `log`. Each `--flag=PATH` naming a file of this machine is given a copy of that file in
    /// [`FILES_DIR`] instead, owned by the image's user.
    pub async fn start(image: &str, args: &[String], log: &Path) -> Result<Self, String> {
        let (name, tag) = image
            .rsplit_once(':')
            .ok_or_else(|| format!("image {image:?} has no tag"))?;
        let user = image_user(image)?;
        let files =
            dirs::temp_dir("etcd-grpc-proxy-files-").map_err(|e| format!("temp dir: {e}"))?;
        let args = move_files(args, files.path(), user)?;
        chown(files.path(), Some(user.0), Some(user.1))
            .map_err(|e| format!("chown {}: {e}", files.path().display()))?;
        let container = GenericImage::new(name, tag)
            .with_network("host")
            .with_mount(
                Mount::bind_mount(files.path().display().to_string(), FILES_DIR)
                    .with_access_mode(AccessMode::ReadOnly),
            )
            .with_cmd(args)
            .start()
            .await
            .map_err(|e| format!("start {image} with testcontainers: {e}"))?;
        copy_output(&container, log).await?;
        let pid = inspect(container.id(), "{{.State.Pid}}")?
            .parse()
            .map_err(|e| format!("the container's pid: {e}"))?;
        Ok(Self {
            container,
            pid,
            _files: files,
        })
    }

    /// The proxy's PID on this machine (the container shares the host's network, not its PID namespace, but the
    /// host sees every process).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// How the container ended, if it has: `exit code N`.
    pub fn exited(&self) -> Option<String> {
        match inspect(
            self.container.id(),
            "{{.State.Running}} {{.State.ExitCode}}",
        ) {
            Ok(state) => match state.split_once(' ') {
                Some(("false", code)) => Some(format!("exit code {code}")),
                _ => None,
            },
            Err(e) => Some(e),
        }
    }

    /// Asks the proxy to shut down gracefully (SIGTERM, as `docker stop` sends it).
    pub fn terminate(&self) {
        let _ = Command::new("docker")
            .args(["kill", "--signal=TERM", self.container.id()])
            .output();
    }
}

/// The numeric `uid:gid` the image runs as (its `USER`).
fn image_user(image: &str) -> Result<(u32, u32), String> {
    let user = inspect(image, "{{.Config.User}}")?;
    let numbers = user
        .split_once(':')
        .and_then(|(u, g)| Some((u.parse().ok()?, g.parse().ok()?)));
    numbers.ok_or_else(|| format!("{image} runs as {user:?}, not a numeric uid:gid"))
}

/// `args` with every `--flag=PATH` naming a file replaced by `--flag=FILES_DIR/N-NAME`, the file copied to
/// `dir/N-NAME` and given to `owner` (uid, gid).
fn move_files(args: &[String], dir: &Path, owner: (u32, u32)) -> Result<Vec<String>, String> {
    let mut out = Vec::with_capacity(args.len());
    for (n, arg) in args.iter().enumerate() {
        let file = arg
            .split_once('=')
            .filter(|(flag, path)| flag.starts_with("--") && Path::new(path).is_file());
        let Some((flag, path)) = file else {
            out.push(arg.clone());
            continue;
        };
        let path = PathBuf::from(path);
        let base = path.file_name().and_then(|b| b.to_str()).unwrap_or("file");
        let copy = format!("{n}-{base}");
        std::fs::copy(&path, dir.join(&copy))
            .map_err(|e| format!("copy {} for the container: {e}", path.display()))?;
        chown(dir.join(&copy), Some(owner.0), Some(owner.1))
            .map_err(|e| format!("chown {copy}: {e}"))?;
        out.push(format!("{flag}={FILES_DIR}/{copy}"));
    }
    Ok(out)
}

/// Appends the container's stdout and stderr to `log` as they come, from tasks of their own.
async fn copy_output(container: &ContainerAsync<GenericImage>, log: &Path) -> Result<(), String> {
    for stream in [container.stdout(true), container.stderr(true)] {
        let mut file = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .await
            .map_err(|e| format!("open log {}: {e}", log.display()))?;
        tokio::spawn(async move {
            let mut stream = stream;
            let _ = tokio::io::copy_buf(&mut stream, &mut file).await;
            let _ = file.flush().await;
        });
    }
    Ok(())
}

/// `docker inspect --format FORMAT ID` (of a container or an image), trimmed.
fn inspect(id: &str, format: &str) -> Result<String, String> {
    let out = Command::new("docker")
        .args(["inspect", "--format", format, id])
        .output()
        .map_err(|e| format!("docker inspect: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "docker inspect {id}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_naming_files_get_copies_in_the_mounted_directory_and_others_stay() {
        let src = dirs::temp_dir("testkit-image-src-").unwrap();
        let dst = dirs::temp_dir("testkit-image-dst-").unwrap();
        let key = src.path().join("key.pem");
        std::fs::write(&key, "secret").unwrap();
        let args = vec![
            "--endpoints=127.0.0.1:2379".to_string(),
            format!("--key-file={}", key.display()),
            "--namespace=/etc/".to_string(),
        ];
        let moved = move_files(&args, dst.path(), (65532, 65533)).unwrap();
        assert_eq!(
            moved,
            [
                "--endpoints=127.0.0.1:2379".to_string(),
                format!("--key-file={FILES_DIR}/1-key.pem"),
                "--namespace=/etc/".to_string(),
            ]
        );
        let copy = dst.path().join("1-key.pem");
        assert_eq!(std::fs::read_to_string(&copy).unwrap(), "secret");
        use std::os::unix::fs::MetadataExt as _;
        let meta = std::fs::metadata(&copy).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (65532, 65533));
    }
}
