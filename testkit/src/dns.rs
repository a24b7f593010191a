//! A DNS server for tests of `--discovery-srv`: on 127.0.0.1, UDP and TCP on one port, answering SRV questions from
//! a table, with messages made by hickory-proto (not by the code under test). Names not in the table get NXDOMAIN;
//! a name can be set to fail with a response code, and answers over UDP can be truncated so that the client must
//! ask again over TCP. It records the questions asked, and stops when dropped.
//!
//! Sockets: see the crate docs (the clippy ban on sockets is lifted here).
#![allow(clippy::disallowed_types)]

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::rdata::SRV;
use hickory_proto::rr::{Name, RData, Record, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::task::JoinHandle;

/// One SRV record: priority, weight, port, target (labels separated by dots; `.` alone is the root, "no service").
pub type SrvRecord = (u16, u16, u16, String);

#[derive(Clone, Debug)]
enum Answer {
    Srv(Vec<SrvRecord>),
    Fail(u8),
}

/// The table and behaviour of a server not started yet.
#[derive(Clone, Debug, Default)]
pub struct FakeDns {
    answers: BTreeMap<String, Answer>,
    truncate_udp: bool,
}

/// A question the server was asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Asked {
    /// The name, without the trailing dot.
    pub name: String,
    /// Whether it came over TCP.
    pub tcp: bool,
}

/// A started server; dropping it stops it.
pub struct RunningDns {
    /// UDP and TCP.
    pub addr: SocketAddr,
    asked: Arc<Mutex<Vec<Asked>>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for RunningDns {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl FakeDns {
    pub fn new() -> Self {
        Self::default()
    }

    /// `name` (without the trailing dot) has these SRV records: (priority, weight, port, target).
    pub fn srv(mut self, name: &str, records: &[(u16, u16, u16, &str)]) -> Self {
        let records = records
            .iter()
            .map(|&(priority, weight, port, target)| (priority, weight, port, target.to_owned()))
            .collect();
        self.answers.insert(name.to_owned(), Answer::Srv(records));
        self
    }

    /// Questions for `name` get response code `rcode` (2: SERVFAIL) and no records.
    pub fn fail(mut self, name: &str, rcode: u8) -> Self {
        self.answers.insert(name.to_owned(), Answer::Fail(rcode));
        self
    }

    /// Answers with records sent over UDP carry none and the TC bit; over TCP they are whole.
    pub fn truncate_udp(mut self) -> Self {
        self.truncate_udp = true;
        self
    }

    /// Serves on a free port of 127.0.0.1 (UDP and TCP both).
    pub async fn start(self) -> io::Result<RunningDns> {
        let (udp, tcp) = bind_pair().await?;
        let addr = udp.local_addr()?;
        let asked = Arc::new(Mutex::new(Vec::new()));
        let server = Arc::new(self);
        let udp_task = {
            let (server, asked) = (server.clone(), asked.clone());
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65_535];
                while let Ok((len, peer)) = udp.recv_from(&mut buf).await {
                    if let Some(answer) = server.answer(&buf[..len], false, &asked) {
                        let _ = udp.send_to(&answer, peer).await;
                    }
                }
            })
        };
        let tcp_task = {
            let asked = asked.clone();
            tokio::spawn(async move {
                while let Ok((conn, _)) = tcp.accept().await {
                    let (server, asked) = (server.clone(), asked.clone());
                    tokio::spawn(async move {
                        let _ = serve_tcp(conn, &server, &asked).await;
                    });
                }
            })
        };
        Ok(RunningDns {
            addr,
            asked,
            tasks: vec![udp_task, tcp_task],
        })
    }

    /// The answer to the message `query`, or `None` when it cannot be read (no answer then, as from a real server).
    fn answer(&self, query: &[u8], tcp: bool, asked: &Mutex<Vec<Asked>>) -> Option<Vec<u8>> {
        let query = Message::from_vec(query).ok()?;
        let question = query.queries.first()?.clone();
        let name = question.name().to_ascii();
        let name = name.strip_suffix('.').unwrap_or(&name).to_owned();
        asked.lock().unwrap().push(Asked {
            name: name.clone(),
            tcp,
        });
        let mut msg = Message::response(query.metadata.id, query.metadata.op_code);
        msg.metadata.recursion_desired = query.metadata.recursion_desired;
        msg.metadata.recursion_available = true;
        msg.metadata.authoritative = true;
        msg.add_query(question.clone());
        match self.answers.get(&name) {
            Some(Answer::Srv(records)) if question.query_type == RecordType::SRV => {
                if self.truncate_udp && !tcp {
                    msg.metadata.truncation = true;
                } else {
                    for (priority, weight, port, target) in records {
                        let srv = SRV::new(*priority, *weight, *port, target_name(target)?);
                        msg.add_answer(Record::from_rdata(
                            question.name().clone(),
                            60,
                            RData::SRV(srv),
                        ));
                    }
                }
            }
            Some(Answer::Srv(_)) => {}
            Some(Answer::Fail(rcode)) => msg.metadata.response_code = ResponseCode::from(0, *rcode),
            None => msg.metadata.response_code = ResponseCode::NXDomain,
        }
        msg.to_vec().ok()
    }
}

impl RunningDns {
    /// `--discovery-srv-dns=<addr>`.
    pub fn flag(&self) -> String {
        format!("--discovery-srv-dns={}", self.addr)
    }

    /// Every question asked, in order.
    pub fn asked(&self) -> Vec<Asked> {
        self.asked.lock().unwrap().clone()
    }

    /// The names asked, in order (over UDP or TCP).
    pub fn names_asked(&self) -> Vec<String> {
        self.asked().into_iter().map(|asked| asked.name).collect()
    }
}

/// A name with any bytes in its labels (a target like `a b` too), fully qualified.
fn target_name(target: &str) -> Option<Name> {
    let labels: Vec<&[u8]> = target
        .split('.')
        .filter(|label| !label.is_empty())
        .map(str::as_bytes)
        .collect();
    let mut name = Name::from_labels(labels).ok()?;
    name.set_fqdn(true);
    Some(name)
}

/// A UDP socket and a TCP listener on the same free port of 127.0.0.1.
async fn bind_pair() -> io::Result<(UdpSocket, TcpListener)> {
    let mut last = None;
    for _ in 0..20 {
        let udp = UdpSocket::bind("127.0.0.1:0").await?;
        match TcpListener::bind(udp.local_addr()?).await {
            Ok(tcp) => return Ok((udp, tcp)),
            // Another process holds the TCP side of this port: take another one.
            Err(err) => last = Some(err),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no free port")))
}

/// Answers the messages of one TCP connection, each behind its two-byte length (RFC 1035 §4.2.2).
async fn serve_tcp(
    mut conn: TcpStream,
    server: &FakeDns,
    asked: &Mutex<Vec<Asked>>,
) -> io::Result<()> {
    loop {
        let mut len = [0u8; 2];
        conn.read_exact(&mut len).await?;
        let mut query = vec![0u8; usize::from(u16::from_be_bytes(len))];
        conn.read_exact(&mut query).await?;
        let Some(answer) = server.answer(&query, true, asked) else {
            return Ok(());
        };
        let len = u16::try_from(answer.len()).map_err(io::Error::other)?;
        conn.write_all(&len.to_be_bytes()).await?;
        conn.write_all(&answer).await?;
    }
}
