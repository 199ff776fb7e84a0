//! The API's unix socket: created with the right owner and mode, every connection's peer
//! checked (root, or a member of `api_group`), each request routed to the tracker.

use std::{
    ffi::CString,
    fs, io,
    os::unix::fs::{FileTypeExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::Arc,
};

use hyper::{server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use log::{debug, info, warn};
use thiserror::Error;
use tokio::{
    net::{UnixListener, UnixStream},
    sync::mpsc,
};

use super::{
    command::Command,
    model::ErrorCode,
    routes::{self, Context},
    views::ApiError,
};
use crate::metrics::Metrics;

#[derive(Debug, Error)]
pub enum ServerError {
    #[error("api_socket {}: {what}: {source}", path.display())]
    Socket {
        path: PathBuf,
        what: &'static str,
        source: io::Error,
    },
    #[error("api_socket {}: another agent answers on it; stop it first", path.display())]
    InUse { path: PathBuf },
    #[error("api_socket {}: exists and is not a socket; refusing to replace it", path.display())]
    NotASocket { path: PathBuf },
    #[error("api_group `{name}`: no such group on this node")]
    UnknownGroup { name: String },
}

/// Who may use the API besides root.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    pub group: Option<u32>,
}

impl Access {
    /// Resolves `api_group` (a name or a numeric gid).
    pub fn from_config(group: Option<&str>) -> Result<Self, ServerError> {
        let group = match group {
            None => None,
            Some(raw) => Some(match raw.parse::<u32>() {
                Ok(gid) => gid,
                Err(_) => gid_of(raw).ok_or_else(|| ServerError::UnknownGroup {
                    name: raw.to_owned(),
                })?,
            }),
        };
        Ok(Self { group })
    }

    /// Whether a peer with these credentials may use the API.
    pub fn allows(&self, uid: u32, gid: u32, supplementary: &[u32]) -> bool {
        uid == 0
            || self
                .group
                .is_some_and(|g| gid == g || supplementary.contains(&g))
    }
}

fn gid_of(name: &str) -> Option<u32> {
    let name = CString::new(name).ok()?;
    let mut group: libc::group = unsafe { std::mem::zeroed() };
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    let mut result: *mut libc::group = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call and buf outlives it.
    let rc = unsafe {
        libc::getgrnam_r(
            name.as_ptr(),
            &mut group,
            buf.as_mut_ptr(),
            buf.len(),
            &mut result,
        )
    };
    (rc == 0 && !result.is_null()).then_some(group.gr_gid)
}

/// The listening API socket; removed when dropped.
pub struct ApiServer {
    listener: UnixListener,
    path: PathBuf,
    access: Access,
}

impl ApiServer {
    /// Creates the socket at `path`: mode 0600, or 0660 owned by the `access` group.
    pub fn bind(path: &Path, access: Access) -> Result<Self, ServerError> {
        let err = |what| {
            let path = path.to_owned();
            move |source| ServerError::Socket { path, what, source }
        };
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir).map_err(err("creating its directory"))?;
        }
        match fs::symlink_metadata(path) {
            Ok(meta) if !meta.file_type().is_socket() => {
                return Err(ServerError::NotASocket {
                    path: path.to_owned(),
                })
            }
            Ok(_) => {
                if std::os::unix::net::UnixStream::connect(path).is_ok() {
                    return Err(ServerError::InUse {
                        path: path.to_owned(),
                    });
                }
                fs::remove_file(path).map_err(err("removing the stale socket"))?;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(err("inspecting it")(e)),
        }
        let listener = UnixListener::bind(path).map_err(err("binding"))?;
        let mode = if access.group.is_some() { 0o660 } else { 0o600 };
        if let Some(gid) = access.group {
            std::os::unix::fs::chown(path, None, Some(gid))
                .map_err(err("giving it to api_group"))?;
        }
        fs::set_permissions(path, fs::Permissions::from_mode(mode))
            .map_err(err("setting its mode"))?;
        info!("API on unix:{} (mode {mode:o})", path.display());
        Ok(Self {
            listener,
            path: path.to_owned(),
            access,
        })
    }

    /// Serves until the task is dropped.
    pub async fn serve(self, commands: mpsc::Sender<Command>, metrics: Arc<Metrics>) {
        let ctx = Context { commands, metrics };
        loop {
            let stream = match self.listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    warn!("API: accepting a connection: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            };
            let allowed = self.peer_allowed(&stream);
            let ctx = ctx.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request| {
                    let ctx = ctx.clone();
                    let allowed = allowed.clone();
                    async move {
                        let response = match &allowed {
                            Ok(()) => routes::handle(request, ctx).await,
                            Err(error) => routes::error_response(error),
                        };
                        Ok::<_, std::convert::Infallible>(response)
                    }
                });
                if let Err(e) = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await
                {
                    debug!("API connection: {e}");
                }
            });
        }
    }

    fn peer_allowed(&self, stream: &UnixStream) -> Result<(), ApiError> {
        let cred = stream.peer_cred().map_err(|e| {
            ApiError::new(
                ErrorCode::Forbidden,
                format!("the peer's credentials cannot be read: {e}"),
            )
        })?;
        let supplementary = cred.pid().map(supplementary_groups).unwrap_or_default();
        if self.access.allows(cred.uid(), cred.gid(), &supplementary) {
            return Ok(());
        }
        warn!(
            "API: refused a peer (uid {}, gid {}, pid {:?}): not root{}",
            cred.uid(),
            cred.gid(),
            cred.pid(),
            if self.access.group.is_some() {
                " nor in api_group"
            } else {
                ""
            }
        );
        Err(ApiError::new(
            ErrorCode::Forbidden,
            format!(
                "uid {} gid {} may not use this API: only root{}",
                cred.uid(),
                cred.gid(),
                self.access
                    .group
                    .map(|g| format!(" and members of group {g} (api_group)"))
                    .unwrap_or_default()
            ),
        ))
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        // Clients then see "no agent" at once rather than a connection refused.
        let _ = fs::remove_file(&self.path);
    }
}

/// The peer process's supplementary groups (SO_PEERCRED gives only the primary one).
fn supplementary_groups(pid: i32) -> Vec<u32> {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status.lines().find_map(|line| {
                line.strip_prefix("Groups:").map(|groups| {
                    groups
                        .split_whitespace()
                        .filter_map(|g| g.parse().ok())
                        .collect()
                })
            })
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_and_the_api_group_are_allowed() {
        let none = Access { group: None };
        assert!(none.allows(0, 0, &[]));
        assert!(!none.allows(1000, 1000, &[1000]));
        let group = Access { group: Some(54321) };
        assert!(group.allows(1000, 54321, &[]));
        assert!(group.allows(1000, 1000, &[7, 54321]));
        assert!(!group.allows(1000, 1000, &[7]));
    }

    #[test]
    fn api_group_resolves_names_and_gids() {
        assert_eq!(Access::from_config(Some("0")).unwrap().group, Some(0));
        assert_eq!(Access::from_config(Some("root")).unwrap().group, Some(0));
        let err = Access::from_config(Some("no-such-group-ipq")).unwrap_err();
        assert!(err.to_string().contains("no-such-group-ipq"), "{err}");
    }
}
