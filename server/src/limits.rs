//! The engine's limits as command-line flags: one `--max-…` flag per
//! [`sluice_engine::limits::Limit`], generated from the engine's list (so a limit added
//! there gets its flag here without another edit), flattened into every command that
//! reads graphs or runs them (`run`, `bench`, `plan`, `validate`, `serve`).

use clap::{Arg, ArgMatches, Args, Command, FromArgMatches};
use sluice_engine::limits::{Limit, Limits};

/// The limits a command runs under: the engine's defaults, changed by the flags given.
#[derive(Debug, Clone, Default)]
pub struct LimitArgs(pub Limits);

/// The flag without its leading dashes (clap's long name).
fn long(limit: Limit) -> &'static str {
    limit.flag().trim_start_matches('-')
}

impl Args for LimitArgs {
    fn augment_args(cmd: Command) -> Command {
        let defaults = Limits::default();
        Limit::ALL.iter().fold(cmd, |cmd, &limit| {
            cmd.arg(
                Arg::new(limit.name())
                    .long(long(limit))
                    .value_name("N")
                    .value_parser(clap::value_parser!(u64).range(1..))
                    .help(limit.help().trim().to_string())
                    .long_help(format!(
                        "{} [default: {}]",
                        limit.help().trim(),
                        defaults.get(limit)
                    ))
                    .help_heading("Limits (docs/security.md)"),
            )
        })
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

impl FromArgMatches for LimitArgs {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let mut args = LimitArgs::default();
        args.update_from_arg_matches(matches)?;
        Ok(args)
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        for &limit in Limit::ALL {
            if let Some(&value) = matches.get_one::<u64>(limit.name()) {
                self.0
                    .set(limit, value)
                    .map_err(|e| clap::Error::raw(clap::error::ErrorKind::ValueValidation, e))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Probe {
        #[command(flatten)]
        limits: LimitArgs,
    }

    #[test]
    fn every_engine_limit_has_its_flag_and_keeps_its_default_otherwise() {
        use clap::Parser;
        let probe = Probe::try_parse_from(["probe", "--max-nodes", "12", "--max-rank", "3"])
            .expect("parses");
        assert_eq!(probe.limits.0.max_nodes, 12);
        assert_eq!(probe.limits.0.max_rank, 3);
        assert_eq!(
            probe.limits.0.max_tensor_elements,
            Limits::default().max_tensor_elements
        );
        for &limit in Limit::ALL {
            let parsed = Probe::try_parse_from(["probe", limit.flag(), "5"]).expect("flag");
            assert_eq!(parsed.limits.0.get(limit), 5, "{}", limit.flag());
        }
        assert!(Probe::try_parse_from(["probe", "--max-nodes", "0"]).is_err());
    }

    #[test]
    fn the_security_notes_list_every_limit_with_its_flag() {
        let notes = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/security.md"),
        )
        .expect("docs/security.md");
        for &limit in Limit::ALL {
            assert!(
                notes.contains(&format!("| `{}` |", limit.flag())),
                "docs/security.md has no row for {}",
                limit.flag()
            );
        }
    }
}
