//! Training: optimisers and their schedules ([`optim`]).

pub mod optim;
