//! The API's unix socket: created with the right owner and mode, every connection's peer
//! checked (root, or a member of `api_group`), each request routed to the tracker. A peer that
//! may not use the API gets its one refusal and is closed; connections are bounded in number
//! and in idle time (see [`crate::listen`]).

use std::{
    ffi::CString,
    fs, io,
    os::fd::AsRawFd as _,
    os::unix::fs::{FileTypeExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use ipq_fs::safe_fs::{self, DirAccess, DirError};
use log::{debug, info, warn};
use thiserror::Error;
use tokio::{
    net::{UnixListener, UnixStream},
    sync::mpsc,
};

use super::{
    command::Command,
    model::{ErrorCode, Role},
    peer::{self, Peer},
    routes::{self, Context},
    views::ApiError,
};
use crate::{
    listen::{self, Guard, RateLimited, WriteDeadline},
    metrics::Metrics,
};

/// How long a refused peer's connection may last: enough to read its request and send the
/// refusal, never long enough to hold a descriptor.
const REFUSAL_GRACE: Duration = Duration::from_secs(2);

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
    #[error("api_group or api_admin_group `{name}`: no such group on this node")]
    UnknownGroup { name: String },
    #[error("api_socket's directory: {0}")]
    Dir(#[from] DirError),
}

/// Who may use the API, and for what (see [`super::peer`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Access {
    /// `api_group`: read-only.
    pub group: Option<u32>,
    /// `api_admin_group`: every change but the IPAM routes.
    pub admin_group: Option<u32>,
    /// Where a uid-0 peer's process is read from (`api_peer_procfs`).
    pub procfs: PathBuf,
}

impl Access {
    /// Resolves `api_group` and `api_admin_group` (each a name or a numeric gid).
    pub fn from_config(
        group: Option<&str>,
        admin_group: Option<&str>,
        procfs: Option<&Path>,
    ) -> Result<Self, ServerError> {
        Ok(Self {
            group: group.map(resolve_group).transpose()?,
            admin_group: admin_group.map(resolve_group).transpose()?,
            procfs: peer::procfs_or_default(procfs),
        })
    }

    /// The socket file's group: `api_group`, else `api_admin_group` (an admin member of
    /// another group than `api_group` reaches a socket of `api_group` only as its member too).
    pub fn socket_group(&self) -> Option<u32> {
        self.group.or(self.admin_group)
    }

    /// The role of a non-root peer with these groups; `None` when it may not use the API.
    pub fn role_of_groups(&self, gid: u32, supplementary: &[u32]) -> Option<Role> {
        let member =
            |group: Option<u32>| group.is_some_and(|g| gid == g || supplementary.contains(&g));
        if member(self.admin_group) {
            Some(Role::Admin)
        } else if member(self.group) {
            Some(Role::Read)
        } else {
            None
        }
    }
}

fn resolve_group(raw: &str) -> Result<u32, ServerError> {
    match raw.parse::<u32>() {
        Ok(gid) => Ok(gid),
        Err(_) => gid_of(raw).ok_or_else(|| ServerError::UnknownGroup {
            name: raw.to_owned(),
        }),
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
            // Members of api_group traverse it; nobody else may replace the socket in it.
            safe_fs::ensure_dir(dir, DirAccess::Traversable)?;
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
        let group = access.socket_group();
        let mode = if group.is_some() { 0o660 } else { 0o600 };
        if let Some(gid) = group {
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
    pub async fn serve(
        self,
        commands: mpsc::Sender<Command>,
        metrics: Arc<Metrics>,
        ipam_bins: Arc<crate::ipam::trust::TrustedBins>,
        ipam_records: crate::ipam::records::Records,
    ) {
        let ctx = Context {
            commands,
            metrics,
            ipam_bins,
            ipam_records,
        };
        let mut guard = Guard::new("API", listen::API_MAX_CONNECTIONS)
            .with_reserve(listen::API_ROOT_RESERVE)
            .counting_refusals(ctx.metrics.connections_refused.clone());
        let mut refusals = RateLimited::new(listen::LOG_PERIOD);
        loop {
            let stream = match self.listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    guard.accept_failed(&e).await;
                    continue;
                }
            };
            let allowed = self.peer_allowed(&stream, &mut refusals);
            // Only root (the CNI plugins, the probes) may take the reserved slots: other
            // users' connections, however many, never make a pod's claim wait.
            let privileged = allowed.as_ref().is_ok_and(|peer| peer.role == Role::Root);
            let Some(slot) = guard.admit_reserving(privileged) else {
                drop(stream);
                continue;
            };
            let connection_fd = stream.as_raw_fd();
            let ctx = ctx.clone();
            tokio::spawn(async move {
                let refused = allowed.is_err();
                let service = service_fn(move |request| {
                    let ctx = ctx.clone();
                    let allowed = allowed.clone();
                    async move {
                        let response = match &allowed {
                            Ok(peer) => routes::handle(request, ctx, *peer, connection_fd).await,
                            Err(error) => routes::error_response(error),
                        };
                        Ok::<_, std::convert::Infallible>(response)
                    }
                });
                let mut http = listen::http1();
                if refused {
                    // One answer saying why, then the connection is closed.
                    http.keep_alive(false);
                }
                let stream = WriteDeadline::new(stream, listen::WRITE_STALL_TIMEOUT);
                let connection = http.serve_connection(TokioIo::new(stream), service);
                let result = if refused {
                    match tokio::time::timeout(REFUSAL_GRACE, connection).await {
                        Ok(result) => result,
                        Err(_) => Ok(()),
                    }
                } else {
                    connection.await
                };
                if let Err(e) = result {
                    debug!("API connection: {e}");
                }
                drop(slot);
            });
        }
    }

    /// The peer and its role, if it may use the API at all.
    fn peer_allowed(
        &self,
        stream: &UnixStream,
        refusals: &mut RateLimited,
    ) -> Result<Peer, ApiError> {
        let cred = stream.peer_cred().map_err(|e| {
            ApiError::new(
                ErrorCode::Forbidden,
                format!("the peer's credentials cannot be read: {e}"),
            )
        })?;
        if cred.uid() == 0 {
            let not_root = peer::root_privilege(&self.access.procfs, stream, cred.pid());
            if let Some(why) = not_root {
                if let Some(n) = refusals.allow(Instant::now()) {
                    warn!(
                        "API: a peer of uid 0 (pid {:?}) is read-only: {}{}",
                        cred.pid(),
                        why.reason(),
                        held_back(n)
                    );
                }
            }
            return Ok(Peer {
                uid: 0,
                role: if not_root.is_some() {
                    Role::Read
                } else {
                    Role::Root
                },
                not_root,
            });
        }
        // From the socket itself: /proc/<pid> cannot be used when the agent runs in its own
        // PID namespace, where a peer outside it has pid 0.
        let supplementary = if self.access.socket_group().is_none() {
            Vec::new()
        } else {
            peer_groups(stream).unwrap_or_else(|e| {
                warn!("API: reading a peer's supplementary groups: {e}");
                Vec::new()
            })
        };
        if let Some(role) = self.access.role_of_groups(cred.gid(), &supplementary) {
            return Ok(Peer {
                uid: cred.uid(),
                role,
                not_root: None,
            });
        }
        if let Some(n) = refusals.allow(Instant::now()) {
            warn!(
                "API: refused a peer (uid {}, gid {}, pid {:?}): not root{}{}",
                cred.uid(),
                cred.gid(),
                cred.pid(),
                if self.access.socket_group().is_some() {
                    " nor in api_group or api_admin_group"
                } else {
                    ""
                },
                held_back(n)
            );
        }
        let groups: Vec<String> = [
            self.access.group.map(|g| format!("group {g} (api_group)")),
            self.access
                .admin_group
                .map(|g| format!("group {g} (api_admin_group)")),
        ]
        .into_iter()
        .flatten()
        .collect();
        Err(ApiError::forbidden(
            Role::Read,
            format!(
                "uid {} gid {} may not use this API: only root{}",
                cred.uid(),
                cred.gid(),
                if groups.is_empty() {
                    String::new()
                } else {
                    format!(" and members of {}", groups.join(" or "))
                }
            ),
        ))
    }
}

fn held_back(n: u64) -> String {
    if n > 0 {
        format!(" ({n} more since the last report)")
    } else {
        String::new()
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        // Clients then see "no agent" at once rather than a connection refused.
        let _ = fs::remove_file(&self.path);
    }
}

/// The peer's supplementary groups as of its `connect` (SO_PEERCRED gives only the primary
/// one), read from the socket so that no PID is involved.
fn peer_groups(stream: &UnixStream) -> io::Result<Vec<u32>> {
    let mut groups: Vec<libc::gid_t> = vec![0; 64];
    loop {
        let mut len = (groups.len() * std::mem::size_of::<libc::gid_t>()) as libc::socklen_t;
        // SAFETY: a valid socket and a buffer of `len` bytes.
        let rc = unsafe {
            libc::getsockopt(
                stream.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let count = len as usize / std::mem::size_of::<libc::gid_t>();
        if rc == 0 {
            groups.truncate(count);
            return Ok(groups);
        }
        let err = io::Error::last_os_error();
        // ERANGE: the kernel wrote the size it needs into `len`.
        if err.raw_os_error() == Some(libc::ERANGE) && count > groups.len() {
            groups.resize(count, 0);
            continue;
        }
        return Err(err);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_api_group_reads_and_the_admin_group_changes() {
        let none = Access::from_config(None, None, None).unwrap();
        assert_eq!(none.role_of_groups(1000, &[1000]), None);
        let both = Access {
            group: Some(54321),
            admin_group: Some(54322),
            ..none.clone()
        };
        assert_eq!(both.role_of_groups(54321, &[]), Some(Role::Read));
        assert_eq!(both.role_of_groups(1000, &[7, 54321]), Some(Role::Read));
        assert_eq!(both.role_of_groups(1000, &[54322]), Some(Role::Admin));
        assert_eq!(both.role_of_groups(54321, &[54322]), Some(Role::Admin));
        assert_eq!(both.role_of_groups(1000, &[7]), None);
        assert_eq!(both.socket_group(), Some(54321));
        let admin_only = Access {
            group: None,
            admin_group: Some(54322),
            ..none
        };
        assert_eq!(admin_only.socket_group(), Some(54322));
        assert_eq!(admin_only.role_of_groups(54321, &[]), None);
    }

    #[test]
    fn api_group_resolves_names_and_gids() {
        assert_eq!(
            Access::from_config(Some("0"), None, None).unwrap().group,
            Some(0)
        );
        let access = Access::from_config(Some("root"), Some("0"), None).unwrap();
        assert_eq!((access.group, access.admin_group), (Some(0), Some(0)));
        let err = Access::from_config(None, Some("no-such-group-ipq"), None).unwrap_err();
        assert!(err.to_string().contains("no-such-group-ipq"), "{err}");
    }
}
