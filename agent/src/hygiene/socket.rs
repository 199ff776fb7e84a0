//! A blocking netlink socket for the hygiene worker: one request, its replies read to the end.
//! The worker owns its sockets and runs on a thread of its own, so blocking here never stalls
//! the registry's owner loop.

use std::io;

use netlink_packet_core::{
    NetlinkDeserializable, NetlinkHeader, NetlinkMessage, NetlinkPayload, NetlinkSerializable,
    NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST,
};
use netlink_sys::{Socket, SocketAddr};
use thiserror::Error;

/// Big enough for any dump batch the kernel sends (it sizes them to a page or 32 KiB).
const RECV_BUFFER: usize = 256 * 1024;

/// Kernel receive buffer: acknowledgements of a whole batch of deletions must fit.
const SOCKET_RCVBUF: usize = 4 * 1024 * 1024;

/// Deletions sent before their acknowledgements are read.
pub const MAX_PIPELINED: usize = 256;

#[derive(Debug, Error)]
pub enum SocketError {
    #[error("opening a netlink socket: {0}")]
    Open(#[source] io::Error),
    #[error("netlink send: {0}")]
    Send(#[source] io::Error),
    #[error("netlink receive: {0}")]
    Recv(#[source] io::Error),
    #[error("decoding a netlink reply: {0}")]
    Decode(String),
    #[error("the kernel answered {0}")]
    Kernel(#[source] io::Error),
    #[error("the kernel overran the dump (events lost)")]
    Overrun,
}

impl SocketError {
    /// Did this socket's receive buffer overflow (`ENOBUFS`), losing messages?
    pub fn is_overflow(&self) -> bool {
        matches!(self, Self::Recv(e) if e.raw_os_error() == Some(libc::ENOBUFS))
    }
}

/// One request's outcome (`Ok` or the errno the kernel answered) and how many of the messages
/// sent while carrying it out were counted.
pub type Acked = (Result<(), i32>, u64);

/// One blocking netlink socket of protocol `P` messages.
pub struct NlSocket {
    socket: Socket,
    seq: u32,
    buf: Vec<u8>,
}

impl NlSocket {
    pub fn open(protocol: isize) -> Result<Self, SocketError> {
        let mut socket = Socket::new(protocol).map_err(SocketError::Open)?;
        socket.bind_auto().map_err(SocketError::Open)?;
        socket
            .connect(&SocketAddr::new(0, 0))
            .map_err(SocketError::Open)?;
        // Best effort: a smaller buffer only means smaller pipelined batches succeed. With
        // CAP_NET_ADMIN past net.core.rmem_max (echoed notices of a large flush must fit).
        let size = SOCKET_RCVBUF as libc::c_int;
        // SAFETY: setsockopt on a socket this function owns, with a c_int of the right size.
        let forced = unsafe {
            libc::setsockopt(
                std::os::fd::AsRawFd::as_raw_fd(&socket),
                libc::SOL_SOCKET,
                libc::SO_RCVBUFFORCE,
                std::ptr::addr_of!(size).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        } == 0;
        if !forced {
            let _ = socket.set_rx_buf_sz(SOCKET_RCVBUF);
        }
        let _ = socket.set_ext_ack(true);
        Ok(Self {
            socket,
            seq: 0,
            buf: vec![0; RECV_BUFFER],
        })
    }

    fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1).max(1);
        self.seq
    }

    /// One object: sends `payload` as a request (no dump) and returns the kernel's answer, or
    /// `None` when it answered `ENODEV`/`ENOENT` (no such object).
    pub fn get<T>(&mut self, payload: T) -> Result<Option<T>, SocketError>
    where
        T: NetlinkSerializable + NetlinkDeserializable + Clone + std::fmt::Debug,
    {
        let seq = self.send(&[payload], NLM_F_REQUEST | NLM_F_ACK)?;
        let mut answer = None;
        let mut done = false;
        while !done {
            self.receive(|message: NetlinkMessage<T>| {
                if message.header.sequence_number != seq {
                    return Ok(());
                }
                match message.payload {
                    NetlinkPayload::InnerMessage(inner) => answer = Some(inner),
                    NetlinkPayload::Error(e) => {
                        done = true;
                        match e.code.map(|c| -c.get()) {
                            None => {}
                            Some(libc::ENODEV | libc::ENOENT) => answer = None,
                            Some(code) => return Err(SocketError::Kernel(errno(-code))),
                        }
                    }
                    NetlinkPayload::Overrun(_) => return Err(SocketError::Overrun),
                    _ => {}
                }
                Ok(())
            })?;
        }
        Ok(answer)
    }

    /// Dumps: sends `payload` with `NLM_F_DUMP` and hands every reply to `each`.
    pub fn dump<T>(&mut self, payload: T, mut each: impl FnMut(T)) -> Result<(), SocketError>
    where
        T: NetlinkSerializable + NetlinkDeserializable + Clone + std::fmt::Debug,
    {
        let seq = self.send(&[payload], NLM_F_REQUEST | NLM_F_DUMP)?;
        let mut done = false;
        while !done {
            self.receive(|message: NetlinkMessage<T>| {
                if message.header.sequence_number != seq {
                    return Ok(());
                }
                match message.payload {
                    NetlinkPayload::InnerMessage(inner) => each(inner),
                    NetlinkPayload::Done(_) => done = true,
                    NetlinkPayload::Error(e) => match e.code {
                        Some(code) => return Err(SocketError::Kernel(errno(code.get()))),
                        None => done = true,
                    },
                    NetlinkPayload::Overrun(_) => return Err(SocketError::Overrun),
                    _ => {}
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    /// Sends every request of `requests` with `NLM_F_ACK` (pipelined, [`MAX_PIPELINED`] at a
    /// time) and returns each one's outcome in order: `Ok` or the errno the kernel answered.
    pub fn acked<T>(&mut self, requests: &[T]) -> Result<Vec<Result<(), i32>>, SocketError>
    where
        T: NetlinkSerializable + NetlinkDeserializable + Clone + std::fmt::Debug,
    {
        let outcomes = self.acked_with(requests, 0, |_: &T| false)?;
        Ok(outcomes.into_iter().map(|(outcome, _)| outcome).collect())
    }

    /// Like [`acked`](Self::acked), with `extra` flags on every request (`NLM_F_CREATE`,
    /// `NLM_F_ECHO`); each outcome comes with how many of the messages the kernel sent while
    /// carrying out that request (before its acknowledgement) `counted` says yes to: with
    /// `NLM_F_ECHO`, the notifications it echoed back to this socket. (A netlink socket's
    /// requests are carried out in order, and what each sends reaches the socket before its
    /// acknowledgement.)
    pub fn acked_with<T>(
        &mut self,
        requests: &[T],
        extra: u16,
        counted: impl Fn(&T) -> bool,
    ) -> Result<Vec<Acked>, SocketError>
    where
        T: NetlinkSerializable + NetlinkDeserializable + Clone + std::fmt::Debug,
    {
        let mut outcomes = Vec::with_capacity(requests.len());
        for chunk in requests.chunks(MAX_PIPELINED) {
            let last = self.send(chunk, NLM_F_REQUEST | NLM_F_ACK | extra)?;
            let first = last.wrapping_sub(chunk.len() as u32 - 1);
            let mut got: Vec<Option<Result<(), i32>>> = vec![None; chunk.len()];
            let mut seen: Vec<u64> = vec![0; chunk.len()];
            let mut pending = chunk.len();
            while pending > 0 {
                self.receive(|message: NetlinkMessage<T>| {
                    match message.payload {
                        NetlinkPayload::Error(e) => {
                            let index = message.header.sequence_number.wrapping_sub(first);
                            if let Some(slot) = got.get_mut(index as usize) {
                                if slot.is_none() {
                                    pending -= 1;
                                }
                                *slot = Some(e.code.map_or(Ok(()), |c| Err(-c.get())));
                            }
                        }
                        NetlinkPayload::InnerMessage(inner) if counted(&inner) => {
                            // Belongs to the first request not yet acknowledged.
                            if let Some(index) = got.iter().position(Option::is_none) {
                                seen[index] += 1;
                            }
                        }
                        _ => {}
                    }
                    Ok(())
                })?;
            }
            outcomes.extend(
                got.into_iter()
                    .zip(seen)
                    .map(|(o, n)| (o.unwrap_or(Ok(())), n)),
            );
        }
        Ok(outcomes)
    }

    /// Sends `payloads` in one datagram with consecutive sequence numbers; returns the last.
    fn send<T>(&mut self, payloads: &[T], flags: u16) -> Result<u32, SocketError>
    where
        T: NetlinkSerializable + Clone + std::fmt::Debug,
    {
        let mut out = Vec::new();
        let mut seq = 0;
        for payload in payloads {
            seq = self.next_seq();
            let mut header = NetlinkHeader::default();
            header.flags = flags;
            header.sequence_number = seq;
            let mut message =
                NetlinkMessage::new(header, NetlinkPayload::InnerMessage(payload.clone()));
            message.finalize();
            let start = out.len();
            out.resize(start + message.buffer_len(), 0);
            message.serialize(&mut out[start..]);
        }
        self.socket.send(&out, 0).map_err(SocketError::Send)?;
        Ok(seq)
    }

    /// Reads what is queued without waiting and counts the messages `counted` says yes to:
    /// after an overflow, what is left of a request's echoes (and its acknowledgement, which
    /// is dropped: the request is sent again).
    pub fn drain_counting<T>(&mut self, counted: impl Fn(&T) -> bool) -> u64
    where
        T: NetlinkDeserializable + std::fmt::Debug,
    {
        let mut n = 0;
        loop {
            let result = self.receive_flags(libc::MSG_DONTWAIT, |message: NetlinkMessage<T>| {
                if let NetlinkPayload::InnerMessage(inner) = &message.payload {
                    if counted(inner) {
                        n += 1;
                    }
                }
                Ok(())
            });
            match result {
                Ok(()) => {}
                // Another overflow notice: what follows it is still to be read.
                Err(e) if e.is_overflow() => {}
                Err(_) => return n,
            }
        }
    }

    /// Reads one datagram and hands each message in it to `each`.
    fn receive<T>(
        &mut self,
        each: impl FnMut(NetlinkMessage<T>) -> Result<(), SocketError>,
    ) -> Result<(), SocketError>
    where
        T: NetlinkDeserializable + std::fmt::Debug,
    {
        self.receive_flags(0, each)
    }

    fn receive_flags<T>(
        &mut self,
        flags: libc::c_int,
        mut each: impl FnMut(NetlinkMessage<T>) -> Result<(), SocketError>,
    ) -> Result<(), SocketError>
    where
        T: NetlinkDeserializable + std::fmt::Debug,
    {
        let size = self
            .socket
            .recv(&mut &mut self.buf[..], flags)
            .map_err(SocketError::Recv)?;
        let mut offset = 0;
        while offset < size {
            let bytes = &self.buf[offset..size];
            let message = NetlinkMessage::<T>::deserialize(bytes)
                .map_err(|e| SocketError::Decode(e.to_string()))?;
            let length = message.header.length as usize;
            each(message)?;
            if length == 0 {
                break;
            }
            offset += (length + 3) & !3;
        }
        Ok(())
    }
}

/// The kernel's negative errno as an I/O error.
fn errno(code: i32) -> io::Error {
    io::Error::from_raw_os_error(-code)
}
