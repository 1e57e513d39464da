from moetier.cli import main

raise SystemExit(main())
