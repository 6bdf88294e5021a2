//! `#[idempotent(steps = …)]`: the body's steps are stored as they finish, so a retry after a
//! failure replays the finished ones (docs/steps.md, docs/attribute.md).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use idem::{idempotent, Error, Idempotency, MemoryStore};

struct Rides {
    idem: Idempotency,
    charges: AtomicU32,
    receipts: AtomicU32,
    mail_down: AtomicBool,
}

impl Rides {
    #[idempotent(key = request, engine = self.idem, steps = steps)]
    async fn request(&self, request: &str, rider: &str) -> Result<(String, u32, u32), Error> {
        let charge: u32 = steps
            .run("charge", || async {
                Ok::<_, Error>(self.charges.fetch_add(1, Ordering::SeqCst))
            })
            .await?;
        if self.mail_down.swap(false, Ordering::SeqCst) {
            return Err(Error::InvalidConfig("the mail server is down".into()));
        }
        steps
            .run("receipt", || async {
                Ok::<_, Error>(self.receipts.fetch_add(1, Ordering::SeqCst))
            })
            .await?;
        Ok((rider.to_owned(), charge, steps.attempt().number))
    }
}

#[tokio::test]
async fn a_retry_replays_the_finished_steps() {
    let rides = Rides {
        idem: Idempotency::new(MemoryStore::new()),
        charges: AtomicU32::new(0),
        receipts: AtomicU32::new(0),
        mail_down: AtomicBool::new(true),
    };
    let failed = rides.request("req-1", "ada").await;
    assert!(matches!(failed, Err(Error::InvalidConfig(_))), "{failed:?}");
    let retried = rides.request("req-1", "ada").await.unwrap();
    assert_eq!(retried, ("ada".to_owned(), 0, 2));
    assert_eq!(rides.request("req-1", "ada").await.unwrap(), retried);
    assert_eq!(
        rides.charges.load(Ordering::SeqCst),
        1,
        "the charge ran once"
    );
    assert_eq!(rides.receipts.load(Ordering::SeqCst), 1);
    // The default fingerprint still covers the arguments.
    let reused = rides.request("req-1", "bob").await;
    assert!(matches!(reused, Err(Error::KeyReused)), "{reused:?}");
}
