//! One SRV lookup as a stub resolver makes it: the query over UDP to each server in turn, for as many rounds as
//! resolv.conf's `attempts`, each try bounded by its `timeout` (on `tokio::time`); a truncated answer asked again
//! over TCP (RFC 1035 §4.2.2: each message behind a two-byte length). The sockets are the caller's
//! ([`Transport`]), so that this logic runs in tests without a network.
//!
//! Errors read as Go's resolver words them (`lookup NAME on SERVER: no such host`), since etcd prints those.

use std::fmt;
use std::io;
use std::net::SocketAddr;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::resolv_conf::ResolvConf;
use super::wire::{self, Answer, Srv};
use crate::net::{BoxFuture, Conn};

/// The sockets a lookup uses.
pub trait Transport: Send + Sync {
    /// Sends `query` to `server` in one UDP datagram and returns the first datagram back from `server` that
    /// `accept` takes (others, such as late answers to earlier tries, are skipped). Unbounded in time: the caller
    /// bounds it.
    fn udp<'a>(
        &'a self,
        server: SocketAddr,
        query: &'a [u8],
        accept: &'a (dyn Fn(&[u8]) -> bool + Send + Sync),
    ) -> BoxFuture<'a, io::Result<Vec<u8>>>;

    /// A TCP connection to `server`.
    fn tcp(&self, server: SocketAddr) -> BoxFuture<'static, io::Result<Conn>>;
}

/// Why a lookup found nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LookupError {
    /// The name looked up.
    pub name: String,
    /// The last server asked.
    pub server: SocketAddr,
    pub reason: Reason,
}

impl fmt::Display for LookupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "lookup {} on {}: {}",
            self.name, self.server, self.reason
        )
    }
}

/// What went wrong, in Go's resolver's words where it has them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reason {
    /// NXDOMAIN, or an answer without SRV records.
    NoSuchHost,
    /// SERVFAIL or another error code, or an answer that could not be read.
    Misbehaving(String),
    /// No answer within the timeout.
    Timeout,
    /// The socket failed (e.g. connection refused: nothing listens there).
    Io(String),
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::NoSuchHost => f.write_str("no such host"),
            Reason::Misbehaving(why) => write!(f, "server misbehaving ({why})"),
            Reason::Timeout => f.write_str("i/o timeout"),
            Reason::Io(err) => f.write_str(err),
        }
    }
}

/// Looks up the SRV records of `name` through the servers of `conf`, with query ID `id`. A name error or an answer
/// without SRV records ends the lookup (another server would say the same); a timeout, a socket error or a
/// server failure moves on to the next server.
pub async fn lookup_srv(
    conf: &ResolvConf,
    transport: &dyn Transport,
    name: &str,
    id: u16,
) -> Result<Vec<Srv>, LookupError> {
    let error = |server, reason| LookupError {
        name: name.to_owned(),
        server,
        reason,
    };
    let query = wire::query(id, name).map_err(|e| {
        let server = conf.servers.first().copied().unwrap_or(([0; 4], 0).into());
        error(server, Reason::Misbehaving(e))
    })?;
    let mut last = None;
    for _ in 0..conf.attempts.max(1) {
        for &server in &conf.servers {
            match ask(conf, transport, server, &query, id, name).await {
                Ok(answer) if answer.rcode == wire::RCODE_NO_ERROR => {
                    if answer.records.is_empty() {
                        return Err(error(server, Reason::NoSuchHost));
                    }
                    return Ok(answer.records);
                }
                Ok(answer) if answer.rcode == wire::RCODE_NAME_ERROR => {
                    return Err(error(server, Reason::NoSuchHost));
                }
                Ok(answer) => {
                    let what = match answer.rcode {
                        wire::RCODE_SERVER_FAILURE => "SERVFAIL".to_owned(),
                        code => format!("rcode {code}"),
                    };
                    last = Some(error(server, Reason::Misbehaving(what)));
                }
                Err(reason) => last = Some(error(server, reason)),
            }
        }
    }
    Err(last.unwrap_or_else(|| error(([0; 4], 0).into(), Reason::Io("no DNS server".into()))))
}

/// One try at one server: UDP, then TCP if the answer was truncated.
async fn ask(
    conf: &ResolvConf,
    transport: &dyn Transport,
    server: SocketAddr,
    query: &[u8],
    id: u16,
    name: &str,
) -> Result<Answer, Reason> {
    let accept = |msg: &[u8]| wire::parse_answer(msg, id, name) != Err(wire::WireError::NotOurs);
    let msg = tokio::time::timeout(conf.timeout, transport.udp(server, query, &accept))
        .await
        .map_err(|_| Reason::Timeout)?
        .map_err(|e| Reason::Io(e.to_string()))?;
    let answer = read(&msg, id, name)?;
    if !answer.truncated {
        return Ok(answer);
    }
    let msg = tokio::time::timeout(conf.timeout, async {
        let conn = transport.tcp(server).await?;
        exchange_tcp(conn, query).await
    })
    .await
    .map_err(|_| Reason::Timeout)?
    .map_err(|e| Reason::Io(format!("over TCP: {e}")))?;
    let answer = read(&msg, id, name)?;
    if answer.truncated {
        return Err(Reason::Misbehaving("truncated over TCP".into()));
    }
    Ok(answer)
}

fn read(msg: &[u8], id: u16, name: &str) -> Result<Answer, Reason> {
    wire::parse_answer(msg, id, name).map_err(|e| Reason::Misbehaving(e.to_string()))
}

/// Sends `query` on `conn` and reads one message back, each behind its two-byte length (RFC 1035 §4.2.2).
pub async fn exchange_tcp<C: AsyncRead + AsyncWrite + Unpin>(
    mut conn: C,
    query: &[u8],
) -> io::Result<Vec<u8>> {
    let len = u16::try_from(query.len())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "query too long"))?;
    let mut framed = len.to_be_bytes().to_vec();
    framed.extend_from_slice(query);
    conn.write_all(&framed).await?;
    conn.flush().await?;
    let mut len = [0u8; 2];
    conn.read_exact(&mut len).await?;
    let mut msg = vec![0u8; usize::from(u16::from_be_bytes(len))];
    conn.read_exact(&mut msg).await?;
    Ok(msg)
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::Mutex;
    use std::time::Duration;

    use super::*;

    const NAME: &str = "_etcd-client._tcp.example.com";

    /// What the fake sends back to one UDP try.
    enum Udp {
        Answer { rcode: u8, tc: bool, targets: usize },
        Stray,
        Refused,
        Silent,
    }

    /// A fake network: scripted UDP answers, one per try, and a TCP server that answers with one record.
    struct Fake {
        udp: Mutex<VecDeque<Udp>>,
        tried: Mutex<Vec<SocketAddr>>,
        tcp: Mutex<u32>,
    }

    impl Fake {
        fn new(script: impl IntoIterator<Item = Udp>) -> Self {
            Self {
                udp: Mutex::new(script.into_iter().collect()),
                tried: Mutex::default(),
                tcp: Mutex::default(),
            }
        }
    }

    /// The answer to `query` with `rcode`, the TC bit and `targets` records.
    fn answer(query: &[u8], rcode: u8, tc: bool, targets: usize) -> Vec<u8> {
        let mut msg = query[..query.len() - 11].to_vec();
        msg[2] = 0x81 | if tc { 0x02 } else { 0 };
        msg[3] = 0x80 | rcode;
        msg[6..8].copy_from_slice(&(targets as u16).to_be_bytes());
        msg[10..12].copy_from_slice(&[0, 0]);
        for i in 0..targets {
            msg.extend_from_slice(&[0xc0, 12, 0, 33, 0, 1, 0, 0, 0, 60, 0, 10]);
            msg.extend_from_slice(&[0, 0, 0, 0, 0x09, 0x4b, 2, b'm', b'0' + i as u8, 0]);
        }
        msg
    }

    impl Transport for Fake {
        fn udp<'a>(
            &'a self,
            server: SocketAddr,
            query: &'a [u8],
            accept: &'a (dyn Fn(&[u8]) -> bool + Send + Sync),
        ) -> BoxFuture<'a, io::Result<Vec<u8>>> {
            self.tried.lock().unwrap().push(server);
            let step = self.udp.lock().unwrap().pop_front();
            Box::pin(async move {
                match step.expect("the script covers every try") {
                    Udp::Answer { rcode, tc, targets } => Ok(answer(query, rcode, tc, targets)),
                    Udp::Stray => {
                        let mut stray = answer(query, 0, false, 1);
                        stray[1] ^= 1;
                        assert!(!accept(&stray));
                        let good = answer(query, 0, false, 2);
                        assert!(accept(&good));
                        Ok(good)
                    }
                    Udp::Refused => Err(io::ErrorKind::ConnectionRefused.into()),
                    Udp::Silent => std::future::pending().await,
                }
            })
        }

        fn tcp(&self, _server: SocketAddr) -> BoxFuture<'static, io::Result<Conn>> {
            *self.tcp.lock().unwrap() += 1;
            Box::pin(async move {
                let (client, mut server) = tokio::io::duplex(1024);
                tokio::spawn(async move {
                    let mut len = [0u8; 2];
                    server.read_exact(&mut len).await.unwrap();
                    let mut query = vec![0; usize::from(u16::from_be_bytes(len))];
                    server.read_exact(&mut query).await.unwrap();
                    let msg = answer(&query, 0, false, 3);
                    server
                        .write_all(&(msg.len() as u16).to_be_bytes())
                        .await
                        .unwrap();
                    server.write_all(&msg).await.unwrap();
                });
                Ok(Box::new(client) as Conn)
            })
        }
    }

    fn conf() -> ResolvConf {
        ResolvConf {
            servers: vec![
                "10.0.0.1:53".parse().unwrap(),
                "10.0.0.2:53".parse().unwrap(),
            ],
            timeout: Duration::from_secs(5),
            attempts: 2,
        }
    }

    async fn run(fake: &Fake) -> Result<Vec<String>, String> {
        lookup_srv(&conf(), fake, NAME, 42)
            .await
            .map(|records| records.into_iter().map(|r| r.target).collect())
            .map_err(|e| e.to_string())
    }

    #[tokio::test]
    async fn the_first_answer_gives_the_records() {
        let fake = Fake::new([Udp::Answer {
            rcode: 0,
            tc: false,
            targets: 2,
        }]);
        assert_eq!(run(&fake).await.unwrap(), ["m0", "m1"]);
        assert_eq!(*fake.tcp.lock().unwrap(), 0);
    }

    #[tokio::test]
    async fn a_stray_datagram_is_skipped() {
        let fake = Fake::new([Udp::Stray]);
        assert_eq!(run(&fake).await.unwrap(), ["m0", "m1"]);
    }

    #[tokio::test]
    async fn a_truncated_answer_is_asked_again_over_tcp() {
        let fake = Fake::new([Udp::Answer {
            rcode: 0,
            tc: true,
            targets: 0,
        }]);
        assert_eq!(run(&fake).await.unwrap(), ["m0", "m1", "m2"]);
        assert_eq!(*fake.tcp.lock().unwrap(), 1);
    }

    #[tokio::test]
    async fn a_name_error_or_no_records_is_final() {
        for rcode in [0, 3] {
            let fake = Fake::new([Udp::Answer {
                rcode,
                tc: false,
                targets: 0,
            }]);
            assert_eq!(
                run(&fake).await.unwrap_err(),
                format!("lookup {NAME} on 10.0.0.1:53: no such host")
            );
            assert_eq!(fake.tried.lock().unwrap().len(), 1);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn failing_servers_are_tried_in_turn_for_each_attempt() {
        let fake = Fake::new([
            Udp::Refused,
            Udp::Silent,
            Udp::Answer {
                rcode: 2,
                tc: false,
                targets: 0,
            },
            Udp::Answer {
                rcode: 0,
                tc: false,
                targets: 1,
            },
        ]);
        let started = tokio::time::Instant::now();
        assert_eq!(run(&fake).await.unwrap(), ["m0"]);
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        let servers: Vec<String> = fake
            .tried
            .lock()
            .unwrap()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            servers,
            ["10.0.0.1:53", "10.0.0.2:53", "10.0.0.1:53", "10.0.0.2:53"]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_last_failure_is_reported() {
        let fake = Fake::new([Udp::Refused, Udp::Refused, Udp::Refused, Udp::Silent]);
        assert_eq!(
            run(&fake).await.unwrap_err(),
            format!("lookup {NAME} on 10.0.0.2:53: i/o timeout")
        );
        let fake = Fake::new([
            Udp::Silent,
            Udp::Silent,
            Udp::Silent,
            Udp::Answer {
                rcode: 5,
                tc: false,
                targets: 0,
            },
        ]);
        assert_eq!(
            run(&fake).await.unwrap_err(),
            format!("lookup {NAME} on 10.0.0.2:53: server misbehaving (rcode 5)")
        );
    }
}
