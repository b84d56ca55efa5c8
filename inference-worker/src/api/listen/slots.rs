//! The table of open connections and its cap. A new connection takes a
//! free slot, or the slot of the longest-open connection that is only
//! waiting on its client (idle, sending a head or a body), which is closed;
//! when every slot holds a request being answered, it takes one of the few
//! reserve slots, where it gets one answer (`/health`, or a 503) and is
//! closed; past those it is refused at once.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use super::conn::Conn;

/// Which table a connection is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Served normally, keep-alive.
    Normal,
    /// Over the cap: one answer, then closed.
    Reserve,
}

pub struct Slots {
    normal: Table,
    reserve: Table,
    next_id: AtomicU64,
}

/// Connections by id; ids grow, so the first is the longest open.
struct Table {
    cap: usize,
    conns: Mutex<BTreeMap<u64, Arc<Conn>>>,
}

impl Table {
    fn new(cap: usize) -> Table {
        Table {
            cap,
            conns: Mutex::new(BTreeMap::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<u64, Arc<Conn>>> {
        self.conns.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Take a slot for `conn`, evicting a waiting connection if the table
    /// is full; whether one was evicted, or `None` when none could be.
    fn admit(&self, conn: &Arc<Conn>) -> Option<bool> {
        let mut t = self.lock();
        let mut evicted = false;
        if t.len() >= self.cap {
            let victim = t.iter().find(|(_, c)| c.try_evict()).map(|(id, _)| *id)?;
            t.remove(&victim);
            evicted = true;
        }
        t.insert(conn.id, conn.clone());
        Some(evicted)
    }

    fn evict_one(&self) -> bool {
        let mut t = self.lock();
        let victim = t.iter().find(|(_, c)| c.try_evict()).map(|(id, _)| *id);
        victim.is_some_and(|id| t.remove(&id).is_some())
    }
}

/// Where a new connection went.
pub enum Admitted {
    /// In `kind`'s table; `evicted`: another connection was closed for it.
    In {
        conn: Arc<Conn>,
        slot: Slot,
        evicted: bool,
    },
    /// No slot: close it.
    Refused,
}

impl Slots {
    pub fn new(cap: usize, reserve: usize) -> Arc<Slots> {
        Arc::new(Slots {
            normal: Table::new(cap.max(1)),
            reserve: Table::new(reserve.max(1)),
            next_id: AtomicU64::new(0),
        })
    }

    pub fn admit(self: &Arc<Self>) -> Admitted {
        let conn = Conn::new(self.next_id.fetch_add(1, Ordering::Relaxed));
        for kind in [Kind::Normal, Kind::Reserve] {
            if let Some(evicted) = self.table(kind).admit(&conn) {
                let slot = Slot {
                    slots: self.clone(),
                    kind,
                    id: conn.id,
                };
                return Admitted::In {
                    conn,
                    slot,
                    evicted,
                };
            }
        }
        Admitted::Refused
    }

    /// Close the longest-open connection that is only waiting on its
    /// client, to free its file descriptor; whether there was one.
    pub fn evict_one(&self) -> bool {
        self.normal.evict_one() || self.reserve.evict_one()
    }

    /// Open connections (both tables).
    pub fn len(&self) -> usize {
        self.normal.lock().len() + self.reserve.lock().len()
    }

    fn table(&self, kind: Kind) -> &Table {
        match kind {
            Kind::Normal => &self.normal,
            Kind::Reserve => &self.reserve,
        }
    }
}

/// A connection's place in its table, given back on drop.
pub struct Slot {
    slots: Arc<Slots>,
    pub kind: Kind,
    id: u64,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.table(self.kind).lock().remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admit(s: &Arc<Slots>) -> Option<(Arc<Conn>, Slot, bool)> {
        match s.admit() {
            Admitted::In {
                conn,
                slot,
                evicted,
            } => Some((conn, slot, evicted)),
            Admitted::Refused => None,
        }
    }

    #[test]
    fn waiting_connections_make_room_and_busy_ones_overflow_into_the_reserve() {
        let s = Slots::new(2, 1);
        let (a, _sa, ev) = admit(&s).unwrap();
        assert!(!ev);
        let (_b, _sb, _) = admit(&s).unwrap();
        // Full of waiting connections: the longest open (a) is evicted.
        let (c, sc, ev) = admit(&s).unwrap();
        assert!(ev && sc.kind == Kind::Normal);
        assert!(!a.try_evict(), "a is already evicted");
        assert_eq!(s.len(), 2);
        // b and c busy answering: the next goes to the reserve, the one
        // after is refused.
        let _fb = s.normal.lock()[&1].begin(false);
        let _fc = c.begin(false);
        let (_d, sd, _) = admit(&s).unwrap();
        assert_eq!(sd.kind, Kind::Reserve);
        // The reserve's connection is waiting for its head: a newer one
        // takes its place.
        let (_e, se, ev) = admit(&s).unwrap();
        assert!(ev && se.kind == Kind::Reserve);
        drop(se);
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn a_connection_receiving_a_body_can_be_evicted_one_being_answered_cannot() {
        let s = Slots::new(1, 1);
        let (a, _sa, _) = admit(&s).unwrap();
        let (flight, watch) = a.begin(true).unwrap();
        watch.done();
        assert!(!a.try_evict(), "answering");
        drop(flight);
        assert!(a.try_evict(), "idle again");
        let (b, _sb, _) = admit(&s).unwrap();
        let _receiving = b.begin(true).unwrap();
        assert!(b.try_evict(), "still receiving its body");
    }
}
